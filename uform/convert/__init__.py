"""``uform.convert``: a CLIP, Chinese-CLIP, SigLIP or CLAP checkpoint as one uform file (format version 2).

:func:`convert` reads a source (a local Hugging Face model directory, or a Hub id through
``huggingface_hub``, the local cache first), maps it with the family's module (``hf_clip``,
``hf_chinese_clip``, ``hf_siglip``, ``hf_clap``, ``open_clip``), and writes the file whole or not at all (:mod:`uform.core.files`:
a temporary name beside ``out``, synced, checked whole, then renamed), so ``out`` is either the
whole new file or untouched.
Anything refused writes nothing. docs/models.md describes the families and what a converted
file holds.
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from uform.core import files
from uform.core.checkpoint import is_checkpoint_file
from uform.core.config import ModelConfig
from uform.core.errors import CheckpointError
from uform.core.host import get_host
from uform.core.runtime import plan_towers
from uform.core.safetensors import DTYPE_NAMES, Container, Entry

from .common import Converted
from .sources import HUB_BIN_PATTERNS, HUB_PATTERNS, ConvertError, Weights, read_json, resolve, weights
from .write import shape_of, stream

__all__ = ["Conversion", "ConvertError", "convert", "SUPPORTED", "DTYPES"]

SUPPORTED = (
    "CLIPModel (config.json model_type 'clip')",
    "SiglipModel (model_type 'siglip': SigLIP, and SigLIP 2 at a fixed resolution)",
    "Siglip2Model (model_type 'siglip2': SigLIP 2 NaFlex, each picture at its own grid)",
    "ChineseCLIPModel (model_type 'chinese_clip': OFA-Sys's Chinese CLIPs, a BERT text tower)",
    "ClapModel (model_type 'clap': LAION's CLAP, text and audio; the unfused checkpoints)",
    "open_clip (open_clip_config.json with open_clip_model.safetensors or open_clip_pytorch_model.bin)",
)
DTYPES: dict[str, np.dtype[Any]] = {
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
}


@dataclass(frozen=True)
class Conversion:
    """What :func:`convert` wrote: the file, the source's family, name and architecture, the
    tensors' dtype, counts, and notes (defaults the conversion took where the source said nothing)."""

    out: Path
    family: str
    name: str
    architecture: str
    dtype: str
    tensors: int
    parameters: int
    bytes: int
    notes: tuple[str, ...]


def convert(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    dtype: str = "bf16",
    name: str | None = None,
    frames: int | None = None,
    force: bool = False,
) -> Conversion:
    """Convert ``source`` into the uform file ``out``.

    ``source``: a directory as ``save_pretrained`` writes it (``config.json``, the weights as
    ``model.safetensors``, its shards, or ``pytorch_model.bin``, the tokenizer's files,
    ``preprocessor_config.json``), an open_clip directory (``open_clip_config.json``), or a
    Hugging Face Hub id (``openai/clip-vit-base-patch32``: the local cache first; a download
    only where ``HF_HUB_OFFLINE`` is unset). ``dtype``: the stored weights, ``"bf16"``
    (default, half the size), ``"f16"`` or ``"f32"`` (the float32 path's exact weights).
    ``name``: what the file records as its source (default: the Hub id or directory name); an
    empty one, or one holding a line break or another control character, is refused.
    ``frames``: the frames ``video_encode`` samples and averages through the image tower (None: 8);
    given for a model without an image tower (CLAP), it is refused: there is no video tower to set.
    ``out`` may replace a uform checkpoint; any other file there is refused unless ``force``.

    Raises :class:`ConvertError` naming the file, tensor or field (a missing file, an unsupported
    architecture, a tensor whose shape disagrees with the config, NaN weights, a tokenizer that
    does not parse, a field of the wrong kind, a value the load of a uform file would refuse),
    :class:`uform.core.files.OutputError` (an ``OSError``) naming ``out`` where it
    cannot be written (a missing or read-only folder, a read-only file, a device, a full disk, a
    file size limit); either way ``out`` is untouched and no temporary file is left.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if frames is not None and (not isinstance(frames, int) or isinstance(frames, bool) or not 1 <= frames <= 256):
        raise ValueError(f"frames must be an integer in [1, 256], got {frames!r}")
    if name is not None and (not isinstance(name, str) or not name.strip() or not name.isprintable()):
        raise ValueError(f"name must be some printable text (what the file records as its source), got {name!r}")
    target = Path(out)
    if target.is_dir():
        raise ConvertError(f"{target}: is a directory; give the path of the .safetensors file to write")
    if target.exists() and not force and not is_checkpoint_file(target):
        raise ConvertError(f"{target}: exists and is not a uform checkpoint; refused (force=True, uform convert --force, replaces it)")
    directory, found_name = resolve(source)
    if name is None and not found_name.isprintable():  # a line break, a control character, a byte not UTF-8
        raise ConvertError(f"{directory}: its name is not printable text, which the file would record as its source; give one (name=..., uform convert --name)")
    record_name = name or found_name
    _refuse_a_source_file(target, directory)
    with files.Outputs() as outs, outs.open(target) as f:  # made now: an unwritable place fails before any work
        converted, held = _convert(directory, record_name, 8 if frames is None else frames)
        try:
            if frames is not None and "video" not in converted.config["towers"]:
                source_info = converted.config["source"]
                raise ConvertError(f"{directory}: frames {frames} (--frames) sets what video_encode averages through the image tower, but "
                                   f"{source_info['family']} ({source_info['architecture']}) has no image tower, so no video tower; leave it out")
            if target.exists() and any(os.path.samefile(target, read) for read in held.files):  # force or not: it would be lost
                raise ConvertError(f"{target}: is the source's own weights, which this conversion reads; give another OUT")
            _check_loads(directory, converted, DTYPES[dtype])
        except BaseException:
            held.close()
            raise
        metadata = {
            "uform": json.dumps(converted.config, sort_keys=True, separators=(",", ":")),
            "tokenizer": converted.tokenizer,
        }
        try:
            stream(f, converted.tensors, metadata, held, DTYPES[dtype])
        finally:
            held.close()
    source_info = converted.config["source"]
    return Conversion(
        out=target,
        family=source_info["family"],
        name=source_info["name"],
        architecture=source_info["architecture"],
        dtype=dtype,
        tensors=len(converted.tensors),
        parameters=sum(int(np.prod(shape_of(t), dtype=np.int64)) for t in converted.tensors.values()),
        bytes=target.stat().st_size,
        notes=tuple(converted.notes),
    )


def _convert(directory: Path, name: str, frames: int) -> tuple[Converted, Weights]:
    """The family's mapping of ``directory`` and its weights, open (the caller closes them)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        converter = f"uform {version('uform')}"
    except PackageNotFoundError:  # a source tree run without an install
        converter = "uform"
    if (directory / "config.json").is_file():
        cfg = read_json(directory / "config.json")
        model_type = cfg.get("model_type")
        architectures = cfg.get("architectures") or []
        architecture = str(architectures[0]) if architectures else str(model_type)
        if model_type == "siglip2" or "Siglip2Model" in architectures:
            from . import hf_siglip2

            family, module = "siglip2", hf_siglip2.convert
        elif model_type == "clip":
            from . import hf_clip

            family, module = "clip", hf_clip.convert
        elif model_type == "chinese_clip":
            from . import hf_chinese_clip

            family, module = "chinese_clip", hf_chinese_clip.convert
        elif model_type == "siglip":
            from . import hf_siglip

            family, module = _siglip_family(directory), hf_siglip.convert
        elif model_type == "clap":
            from . import hf_clap

            family, module = "clap", hf_clap.convert
        else:
            raise ConvertError(
                f"{directory / 'config.json'}: architecture {architecture} (model_type {model_type!r}) is not supported; "
                f"supported: {'; '.join(SUPPORTED)}"
            )
        prefix = ""
    elif (directory / "open_clip_config.json").is_file():
        from . import open_clip

        cfg = read_json(directory / "open_clip_config.json")
        family, module, prefix = "open_clip", open_clip.convert, "open_clip_"
        architecture = open_clip.architecture(cfg)
    else:
        present = ", ".join(sorted(p.name for p in directory.iterdir())[:12]) or "nothing"
        raise ConvertError(f"{directory}: no config.json (nor open_clip_config.json); it holds {present}")
    source = {"family": family, "name": name, "architecture": architecture, "converter": converter}
    held = weights(directory, prefix)
    try:
        return module(directory, cfg, held, source, frames), held
    except BaseException:
        held.close()
        raise


def _refuse_a_source_file(target: Path, directory: Path) -> None:
    """``target`` being one of the files a conversion reads in ``directory`` (its config, tokenizer,
    preprocessing, weights; or a link to one) is refused, ``force`` or not: replacing it would
    leave a source that no longer converts."""
    if not target.exists():
        return
    for read in directory.iterdir():
        if any(fnmatch.fnmatchcase(read.name, p) for p in HUB_PATTERNS + HUB_BIN_PATTERNS) and read.is_file() and os.path.samefile(target, read):
            what = "weights" if read.suffix in (".safetensors", ".bin") else read.name
            raise ConvertError(f"{target}: is the source's own {what}, which this conversion reads; give another OUT")


# A tokenizer.json of no tokens: the load's checks of the tokenizer (it parses, its tokens fit the
# embedding) were made when the converter took it (tokenizer.py), and a second parse of the real
# one would cost 0.1 s, a fifth of a ViT-B/16's conversion.
NO_TOKENS = json.dumps({"version": "1.0", "model": {"type": "WordLevel", "vocab": {}, "unk_token": "<unk>"}})


def _check_loads(directory: Path, converted: Converted, dtype: np.dtype[Any]) -> None:
    """The file about to be written passes the checks a load makes (its config's fields, each
    tower's tensors by name and shape), so that a source uform cannot run is refused now, naming
    the field, not at the converted file's first load."""
    entries = {name: Entry(name, DTYPE_NAMES[dtype], shape_of(t), 0, 0) for name, t in converted.tensors.items()}
    try:
        config = ModelConfig.from_dict(converted.config, {"tokenizer": NO_TOKENS})
        plan_towers(Container({}, entries, memoryview(b"")), config, get_host())
    except CheckpointError as exc:
        raise ConvertError(f"{directory}: the converted file would not load ({exc}); nothing was written") from None


def _siglip_family(directory: Path) -> str:
    """``siglip2`` where the tokenizer is Gemma's (SigLIP 2's, or transformers' Siglip2Tokenizer), else ``siglip``."""
    path = directory / "tokenizer_config.json"
    tokenizer_class = read_json(path).get("tokenizer_class") if path.is_file() else None
    from .hf_siglip import GEMMA

    return "siglip2" if isinstance(tokenizer_class, str) and tokenizer_class.startswith(GEMMA) else "siglip"
