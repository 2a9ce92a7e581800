"""Where a conversion's source is: a local model directory, or a Hugging Face Hub id found in the
local cache first and downloaded (``huggingface_hub``) only where ``HF_HUB_OFFLINE`` is unset."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConvertError

__all__ = ["HUB_BIN_PATTERNS", "HUB_PATTERNS", "resolve"]

# The files a Hub download fetches: everything a conversion reads, and no other weights.
HUB_PATTERNS = ["*.json", "*.txt", "*.model", "model.safetensors", "model-*.safetensors", "open_clip_model.safetensors"]
HUB_BIN_PATTERNS = ["pytorch_model.bin", "open_clip_pytorch_model.bin"]
# What a user without the Hub does, said by both errors that find no model to convert.
OFFLINE_WAY = ("without a network, convert a model directory instead (the files save_pretrained writes, or the Hub "
               "repository's files copied from a machine that has them), or fill this machine's Hugging Face cache "
               "(HF_HOME) with that model (docs/models.md, \"Convert\")")


def resolve(source: str | os.PathLike[str]) -> tuple[Path, str]:
    """The local directory of ``source`` and the name the file records for it.

    A path that exists is used as it is (a directory). Otherwise ``source`` must look like a
    Hub id (``owner/name``): it is looked up in the local Hugging Face cache first, and
    downloaded only where ``HF_HUB_OFFLINE`` is unset.
    """
    path = Path(source)
    if path.exists():
        if not path.is_dir():
            raise ConvertError(f"{path}: not a model directory (a conversion reads a directory with config.json or open_clip_config.json)")
        return path, path.resolve().name
    text = str(source)
    parts = text.split("/")
    if len(parts) != 2 or not all(parts) or text.startswith((".", "~")):
        raise ConvertError(f"{text}: no such directory, and not a Hugging Face Hub id of the form owner/name")
    return _hub(text), text


def _hub(repo: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ConvertError(f"{repo}: not a local directory; reading a Hub id needs huggingface_hub (pip install huggingface_hub)") from None
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    home = os.environ.get("HF_HOME")
    cache = os.environ.get("HF_HUB_CACHE") or (os.path.join(home, "hub") if home else None)  # read now, not at import
    try:
        found = Path(snapshot_download(repo, allow_patterns=HUB_PATTERNS, local_files_only=True, cache_dir=cache))
        if _has_weights(found) and (offline or _complete(found)):  # offline, the conversion names what is missing
            return found
    except LocalEntryNotFoundError:
        pass
    except Exception as exc:  # noqa: BLE001 - any Hub error is the user's to read
        raise ConvertError(f"{repo}: cannot read it from the Hugging Face cache ({exc})") from None
    if offline:
        raise ConvertError(f"{repo}: not in the local Hugging Face cache, and HF_HUB_OFFLINE forbids a download; {OFFLINE_WAY}")
    try:
        found = Path(snapshot_download(repo, allow_patterns=HUB_PATTERNS, cache_dir=cache))
        if not _has_weights(found):
            found = Path(snapshot_download(repo, allow_patterns=HUB_PATTERNS + HUB_BIN_PATTERNS, cache_dir=cache))
    except Exception as exc:  # noqa: BLE001
        said = " ".join(str(exc).split())  # the Hub's message runs over lines; the error is one
        raise ConvertError(f"{repo}: cannot download it from the Hugging Face Hub ({type(exc).__name__}: {said}); {OFFLINE_WAY}") from None
    return found


def _complete(directory: Path) -> bool:
    """Whether a cached snapshot holds the rest of what a conversion reads, not the weights
    alone (``CLIPModel.from_pretrained`` caches only config.json and the weights): open_clip's
    config, or config.json with a tokenizer (``tokenizer.json``, SentencePiece's ``spiece.model``,
    WordPiece's ``vocab.txt`` or BPE's ``vocab.json`` and ``merges.txt``) and ``preprocessor_config.json``
    (or transformers 5's ``processor_config.json``, which holds it)."""
    if (directory / "open_clip_config.json").is_file():
        return True
    tokenizer = any((directory / n).is_file() for n in ("tokenizer.json", "spiece.model", "vocab.txt")) or all(
        (directory / n).is_file() for n in ("vocab.json", "merges.txt")
    )
    preprocessing = any((directory / n).is_file() for n in ("preprocessor_config.json", "processor_config.json"))
    return tokenizer and preprocessing and (directory / "config.json").is_file()


def _has_weights(directory: Path) -> bool:
    return any((directory / n).is_file() for n in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                                                   "open_clip_model.safetensors", "open_clip_pytorch_model.bin"))  # fmt: skip
