"""Tower export: each tower of a checkpoint as a self-contained ``.onnx`` for other runtimes.

``export_towers(checkpoint, outdir)`` writes, per tower, ``{tower}.onnx`` (standard opset,
weights inside, or as external data in ``{tower}.onnx.data`` beside it past 512 MiB) and
``{tower}.json``: its inputs, outputs, config and preprocessing. Weights are float32
(``quantization="f32"``, runs anywhere) or kept BF16 with a ``Cast`` to float32 in front
of each (``"bf16"``, half the size; the runtime must implement BF16 ``Cast``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import helper

from uform.core import files, jsontext, safetensors
from uform.core.checkpoint import map_file
from uform.core.config import ModelConfig
from uform.core.errors import CheckpointError, UnsupportedError
from uform.core.host import get_host
from uform.core.progress import Progress, ProgressHandler
from uform.core.runtime import build_graph, memory_shortfall, plan_towers
from uform.core.weights import embed
from uform.exporters.onnx_form import readable_as

EXTERNAL_ABOVE = 512 * 1024 * 1024
QUANTIZATIONS = ("f32", "bf16")
BF16 = np.dtype(ml_dtypes.bfloat16)

PREPROCESSING = {
    "text": "UTF-8 bytes, one token per byte, cut to the first `context` bytes; right-padded with 0; `lengths` holds each row's byte count",
    "image": "decode, EXIF orientation, 8-bit RGB (alpha over white), resize shorter side to image_size (bicubic), centre crop; uint8 [S, S, 3]",
    "video": "frames sampled at (i + 0.5) * duration / frames, each preprocessed as an image; uint8 [F, S, S, 3]",
    "audio": "decode, mean of channels, resample to sample_rate, first `samples` samples, zero-padded; float32 [N]",
    "decoder": "begin token 256, then the last `context` bytes of the text; right-padded with 0; `last` is each row's byte count",
}
DOC = "docs/checkpoint.md"


def _preprocessing(name: str, tower: dict[str, Any], context: int, image: dict[str, Any] | None = None) -> str:
    """What feeds tower ``name``, in words: version 1's, or a converted model's options
    (``image``: the image tower's, which a video tower made of it follows)."""
    if name == "text" and tower.get("tokenizer") == "tokenizer.json":
        padded = f"to {tower.get('context', context)} tokens" if tower.get("pad_to_context") else "to the longest row"
        clean, end = tower.get("clean", "none"), tower.get("end_token", "last")
        cleaned = (
            "the text cleaned first as open_clip does (ftfy.fix_text, HTML entities unescaped twice, whitespace runs folded to one space"
            f"{', lower-cased' if clean == 'lower' else ''}), then "
        ) if clean != "none" else ""  # fmt: skip
        ended = f"; each row cut after its first {'largest id' if end == 'max' else f'id {end}'}" if end != "last" else ""
        return (
            f"{cleaned}token ids of text.tokenizer.json (tokenizers library, special tokens added, truncated to {tower.get('context', context)} tokens){ended}; "
            f"right-padded with {tower.get('pad_id', 0)} {padded}; `lengths` holds each row's token count"
        )
    if name == "video" and tower.get("from") == "image":
        grid = (
            ", all at the grid the first sampled frame's size gives (a frame of another size resized to it, bilinear, no crop)"
            if (image or {}).get("resize") == "naflex" else ""
        )  # fmt: skip
        return (
            "frame_embeddings: the image tower's embeddings of `frames` frames sampled at (i + 0.5) * duration / frames, "
            f"each preprocessed as an image{grid}; float32 [F, dimensions] a clip; averaged frame after frame, then renormalised"
        )
    if name == "image" and tower.get("resize") == "naflex":
        return (
            f"decode, EXIF orientation, 8-bit RGB (alpha over white), resize ({tower.get('interpolation', 'bilinear')}, no crop) to the grid of "
            f"at most {tower.get('max_patches')} patches of patch_size its aspect ratio gives (transformers' get_image_size_for_max_num_patches); "
            "patches: uint8 [N, rows x columns, 3 P P], each patch in (channel, row, column) order; positions: float32 [rows x columns, G0 G0], "
            "the antialiased bilinear resize of the G0 x G0 position grid to rows x columns as a matrix (one grid a run)"
        )
    if name in ("image", "video") and {"resize", "interpolation", "resize_rounding", "alpha", "crop_rounding"} & set(tower):
        how = tower.get("interpolation", "bicubic")
        crop = " (offset int(round((T - S) / 2)), half to even)" if tower.get("crop_rounding") == "half_even" else ""
        fit = (
            f"resize to image_size x image_size ({how})"
            if tower.get("resize") == "square"
            else f"resize shorter side to image_size ({how}, longer side {tower.get('resize_rounding', 'half_up').replace('_', ' ')}), centre crop{crop}"
        )
        if tower.get("alpha") == "drop":
            return f"decode, EXIF orientation, {fit} in the picture's own mode (Pillow), then 8-bit RGB (alpha dropped, the colour under it kept); uint8 [S, S, 3]"
        return f"decode, EXIF orientation, 8-bit RGB (alpha over white), {fit}; uint8 [S, S, 3]"
    if name == "audio" and tower.get("fusion") == "aff":
        return (
            "decode, mean of channels, resample to sample_rate, first `max_samples` samples; mels: the four log-mel channels in dB, "
            "float32 [4, 1 + samples // hop, n_mels], and longer: bool, whether the recording passes `samples` by a hop or more (transformers' "
            "ClapFeatureExtractor(truncation='fusion'), each crop at the middle of its third; docs/checkpoint-clap.md, 'Fused towers')"
        )
    if name == "audio" and tower.get("front") == "clap":
        fill = {"repeatpad": "repeated floor(N / length) times, then zero-padded", "repeat": "repeated until full", "pad": "zero-padded"}
        return (
            f"decode, mean of channels, resample to sample_rate, first `samples` samples; a shorter recording "
            f"{fill.get(tower.get('padding', 'repeatpad'), 'zero-padded')} (padding {tower.get('padding', 'repeatpad')!r}, as "
            "transformers' ClapFeatureExtractor; a longer one is its crop at offset 0); float32 [N] (docs/checkpoint-clap.md)"
        )
    return PREPROCESSING.get(name, f"see {DOC}")


def _types(values: Any) -> list[dict[str, Any]]:
    out = []
    for v in values:
        t = v.type.tensor_type
        dims = [d.dim_param or d.dim_value for d in t.shape.dim]
        out.append({"name": v.name, "dtype": helper.tensor_dtype_to_np_dtype(t.elem_type).name, "shape": dims})
    return out


def _bf16_with_casts(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Keep weights BF16 as ``name.bf16`` initializers, each widened by a Cast to ``name``."""
    out = embed(model, {f"{n}.bf16": w for n, w in weights.items()}, lambda w: w)
    casts = [helper.make_node("Cast", [f"{n}.bf16"], [n], to=onnx.TensorProto.FLOAT, name=f"{n}.cast") for n in weights]
    nodes = list(out.graph.node)
    del out.graph.node[:]
    out.graph.node.extend(casts + nodes)
    return out


def export_towers(
    checkpoint: str | os.PathLike[str],
    outdir: str | os.PathLike[str],
    quantization: str = "f32",
    progress: ProgressHandler | None = None,
    *,
    force: bool = False,
) -> dict[str, Path]:
    """Write every tower the installed plugins serve; answer tower name → ``.onnx`` path.

    The files are one set, written whole or not at all (:mod:`uform.core.files`): a bad
    checkpoint, a failed write or a cancel leaves ``outdir`` as it was (not made, when it was
    missing). A file of a tower's names in ``outdir`` that an export did not write (no
    ``{tower}.json`` of this format beside it) is not replaced unless ``force``. The files of an
    earlier export's tower that this checkpoint lacks go, so that ``outdir`` holds one model's towers.
    ``progress(done, total)`` is called as each tower is made, counting the stored bytes of
    the towers' weights (False cancels: ``CancelledError``)."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {quantization!r}")
    if not os.fspath(outdir):  # Path('') is the working folder: `uform export CK "$UNSET"` wrote the towers there
        raise ValueError("the output folder is empty: name the folder to write the towers to")
    out = Path(outdir)
    if out.exists() and not out.is_dir():
        raise files.OutputError(f"{out}: not a folder")
    mapped = map_file(checkpoint)  # before anything is made: a missing checkpoint leaves no folder
    written: dict[str, Path] = {}
    container = None
    try:
        try:
            metadata, entries, start = safetensors.header(len(mapped), lambda begin, end: mapped[begin:end])
            container = safetensors.Container(metadata, entries, memoryview(mapped)[start:])
            config = ModelConfig.from_metadata(container.metadata)
            planned = plan_towers(container, config, get_host())
            # from the header, before a weight is read (a sparse 32 GB file read for 10 s and more, then its
            # tower's float32 copy ran out of memory): the largest tower is held whole, at the export's width
            values = max((sum(math.prod(entries[w].shape) for w in specs) for _, _, specs in planned.values()), default=0)
            short = memory_shortfall(values, 2 if quantization == "bf16" else 4, quantization.upper(), "exported")
            if short:
                raise UnsupportedError(f"{checkpoint}: {short}")
            safetensors.check_finite(container)
        except CheckpointError as exc:
            raise CheckpointError(f"{checkpoint}: {exc}") from None
        for name in planned:

            def ours(_: Path, name: str = name) -> bool:
                return _exported(out, name)

            for path in (out / f"{name}.onnx", out / f"{name}.onnx.data", out / f"{name}.json", *_tokenizer_file(out, name, config)):
                files.refuse_foreign(path, ours, force, "a file of an earlier `uform export`")
                if out.is_dir():
                    files.check_replaceable(path)
        sizes = {name: sum(container.entries[w].end - container.entries[w].begin for w in specs) for name, (_, _, specs) in planned.items()}
        done = Progress(progress, 0, sum(sizes.values()))
        with files.Outputs() as outputs:
            outputs.folder(out)
            for name, (modality, parsed, specs) in planned.items():
                graph = build_graph(name, modality, parsed, config, specs)
                weights = {w: container.array(w) for w in specs}
                if quantization == "bf16":  # a converted model's F16/F32 tensors rounded to BF16 too
                    model = _bf16_with_casts(graph, {w: a if a.dtype == BF16 else a.astype(BF16) for w, a in weights.items()})
                else:
                    model = embed(graph, weights, lambda w: w.astype(np.float32))
                written[name] = _save(model, outputs, out, name)
                _describe(model, outputs, out, name, config, quantization)
                del weights, model
                done.advance(sizes[name])
            for stale in _earlier_towers(out, set(planned)):  # an earlier export's tower this checkpoint lacks
                for path in (out / f"{stale}.onnx", out / f"{stale}.onnx.data", out / f"{stale}.tokenizer.json", out / f"{stale}.json"):
                    if path.is_file() or path.is_symlink():
                        outputs.remove(path)
    finally:
        container = None
        try:
            mapped.close()
        except BufferError:
            pass
    return written


def _earlier_towers(out: Path, towers: set[str]) -> list[str]:
    """Towers of an earlier export in ``out`` (their ``{tower}.json`` an export's) other than ``towers``."""
    if not out.is_dir():
        return []
    return sorted(p.stem for p in out.glob("*.json") if p.stem not in towers and "." not in p.stem and _exported(out, p.stem))


def _exported(out: Path, name: str) -> bool:
    """Whether ``out/{name}.json`` is the description an export writes (so the tower's files are ours)."""
    try:
        info = jsontext.loads((out / f"{name}.json").read_bytes())
    except (OSError, jsontext.NotJSON):
        return False
    return isinstance(info, dict) and info.get("tower") == name and str(info.get("spec", "")).startswith(DOC)


def _save(model: onnx.ModelProto, outputs: files.Outputs, out: Path, name: str) -> Path:
    path, data = out / f"{name}.onnx", out / f"{name}.onnx.data"
    if model.ByteSize() > EXTERNAL_ABOVE:  # onnx writes the weights beside the model by name
        scratch = outputs.scratch(out)
        onnx.save(model, str(scratch / path.name), save_as_external_data=True, location=data.name)
        readable_as(scratch / data.name, scratch / path.name)
        outputs.adopt(scratch / data.name, data)
        outputs.adopt(scratch / path.name, path)
    else:
        with outputs.open(path) as f:
            f.write(model.SerializeToString())
        if data.exists():  # an earlier export's external weights: this one has none
            outputs.remove(data)
    return path


def _describe(model: onnx.ModelProto, outputs: files.Outputs, out: Path, name: str, config: ModelConfig, quantization: str) -> None:
    info = {
        "tower": name,
        "opset": model.opset_import[0].version,
        "weights": quantization,
        "inputs": _types(model.graph.input),
        "outputs": _types(model.graph.output),
        "dimensions": config.dimensions,
        "context": config.context,
        "config": dict(config.towers[name]),
        "preprocessing": _preprocessing(name, dict(config.towers[name]), config.context, dict(config.towers.get("image", {}))),
        "spec": f"{DOC}, section of tower {name!r}",
    }
    with outputs.open(out / f"{name}.json") as f:
        f.write((json.dumps(info, indent=2) + "\n").encode())
    for path in _tokenizer_file(out, name, config):  # a converted model's tokenizer, as the file held it
        with outputs.open(path) as f:
            f.write(config.extras["tokenizer"].encode())


def _tokenizer_file(out: Path, name: str, config: ModelConfig) -> list[Path]:
    """``out/{name}.tokenizer.json`` where the tower reads the checkpoint's own tokenizer (format version 2)."""
    held = config.towers[name].get("tokenizer") == "tokenizer.json" and "tokenizer" in config.extras
    return [out / f"{name}.tokenizer.json"] if held else []


__all__ = ["export_towers", "QUANTIZATIONS"]
