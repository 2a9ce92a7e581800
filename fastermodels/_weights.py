"""An artifact's model.safetensors read whole and paired with the config.json it was saved with.

Reading: the header is read first, bounded as uform's own checkpoints are
(:data:`uform.core.safetensors.MAX_HEADER_BYTES`, :data:`~uform.core.safetensors.MAX_HEADER_TOKENS`)
and parsed refusing a key written twice; the safetensors library keeps the last entry of a
tensor named twice, another reader may keep the first, so two readers would load two models
from one file. The tensors are then read by the safetensors library from the same open file.

Pairing: ``save_pretrained`` records in the weights' ``__metadata__`` the sha256 of the
config.json it writes beside them (:data:`CONFIG_DIGEST`). Its files are renamed into place
one after another, ``config.json`` last, so a save killed between the renames leaves the new
weights beside the old config.json, the new config.json still in the save's hidden
``.*.partial`` folder (fsynced before the first rename). :func:`paired_config` finds the
config.json whose bytes the weights were saved with: the artifact's own, or that one; a
weights file without the digest (an earlier fastermodels') pairs with the artifact's own.
"""

import hashlib
import os
import struct
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch

from fastermodels._errors import ArtifactReadError
from uform.core import jsontext
from uform.core.leftovers import PARTIAL
from uform.core.safetensors import MAX_HEADER_BYTES, MAX_HEADER_TOKENS, json_tokens

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CONFIG_DIGEST = "fastermodels.config_sha256"  # __metadata__ key: sha256 of the config.json saved beside
REPLACED_DIGEST = "fastermodels.replaced_config_sha256"  # and of the config.json that save replaced


def digest(config: bytes) -> str:
    """What :data:`CONFIG_DIGEST` records of a config.json's bytes."""
    return hashlib.sha256(config).hexdigest()


def _header(f: Any, path: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed header of the open safetensors file ``f``, read within the bounds."""
    def unreadable(reason: str) -> ArtifactReadError:
        return ArtifactReadError(f"{path}: not a readable safetensors file ({reason})")

    size = os.fstat(f.fileno()).st_size
    if size < 8:
        raise unreadable(f"{size} bytes is too short for the 8-byte header length")
    (length,) = struct.unpack("<Q", f.read(8))
    if length > MAX_HEADER_BYTES:
        raise unreadable(f"header too large: {length} bytes, over the limit of {MAX_HEADER_BYTES}")
    if 8 + length > size:
        raise unreadable(f"header length {length} runs past the end of the {size}-byte file")
    text = f.read(length)
    tokens = json_tokens(text)
    if tokens > MAX_HEADER_TOKENS:
        raise unreadable(f"header holds {tokens} JSON tokens, over the limit of {MAX_HEADER_TOKENS}")
    try:
        header = jsontext.loads(text, unique_keys=True)
    except jsontext.NotJSON as e:  # 'the key 'net.fc.weight' appears twice in one object'
        raise unreadable(f"header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise unreadable("header is not a JSON object")
    return header


def read_weights(path: str | os.PathLike[str]) -> tuple[dict[str, Any], tuple[str | None, str | None]]:
    """The tensors of a model.safetensors and the config.json digests it records (:func:`_recorded`);
    ArtifactReadError names the file and the reason (a key written twice included)."""
    try:
        with open(path, "rb") as f:
            header = _header(f, path)
            proc = f"/proc/self/fd/{f.fileno()}"  # the file whose header was read, even if replaced since
            state = safetensors.torch.load_file(proc if os.path.exists(proc) else path)
    except (safetensors.SafetensorError, OSError) as e:
        raise ArtifactReadError(f"{path}: not a readable safetensors file ({e})") from None
    return state, _recorded(header)


def _recorded(header: dict[str, Any]) -> tuple[str | None, str | None]:
    """The digests of the config.json saved with the weights and of the one that save replaced
    (None where it records none: an earlier fastermodels', or a save into an empty folder)."""
    metadata = header.get("__metadata__")
    found = [metadata.get(key) if isinstance(metadata, dict) else None for key in (CONFIG_DIGEST, REPLACED_DIGEST)]
    return found[0] if isinstance(found[0], str) else None, found[1] if isinstance(found[1], str) else None


def mismatch(config: str, weights: str, actual: str, saved: str) -> ArtifactReadError:
    """``config`` (of digest ``actual``) is the config.json the save of ``weights`` replaced."""
    return ArtifactReadError(
        f"{config}: the config.json of the save before {weights} (its sha256 is {actual}; the weights were "
        f"saved with {saved}, which is not there): files of two saves, left by a save that was stopped; "
        "nothing was loaded: save the model again (save_pretrained)")


def _bytes(path: Path) -> bytes | None:
    """The bytes of ``path`` when it is a regular file, not a link (a FIFO would hang the read)."""
    return path.read_bytes() if path.is_file() and not path.is_symlink() else None


def paired_config(folder: Path, recorded: tuple[str | None, str | None]) -> bytes | None:
    """The bytes of the config.json of ``folder`` to load the weights recording ``recorded``
    (:func:`_recorded`) with; None when there is none. The artifact's own when the weights were
    saved with it; after a save killed before its last rename (the artifact's own is the one the
    save replaced), the one still in that save's ``.*.partial`` folder, and ArtifactReadError when
    that is gone. A config.json edited after the save is the artifact's own, as before."""
    saved, replaced = recorded
    own = _bytes(folder / CONFIG_FILE)
    if saved is None or own is not None and digest(own) == saved:
        return own
    for scratch in sorted(folder.glob(f".*{PARTIAL}")):
        candidate = None if scratch.is_symlink() else _bytes(scratch / CONFIG_FILE)
        if candidate is not None and digest(candidate) == saved:
            return candidate
    if own is not None and digest(own) == replaced:
        raise mismatch(str(folder / CONFIG_FILE), str(folder / WEIGHTS_FILE), digest(own), saved)
    return own


def settle(folder: Path) -> None:
    """Finish a save of ``folder`` that was killed between its renames, before a new save sweeps
    the killed one's hidden folder: when the weights in place pair with a config.json in such a
    folder (:func:`paired_config`), that config.json is put in place, so the artifact holds, as
    files, the save that a reader already loads from it. Anything else is left as it is."""
    from uform.core.files import write_bytes

    weights = folder / WEIGHTS_FILE
    if not weights.is_file() or weights.is_symlink():
        return
    try:
        with open(weights, "rb") as f:
            recorded = _recorded(_header(f, weights))
        config = paired_config(folder, recorded)
    except (ArtifactReadError, OSError):
        return  # a weights file that does not read, or two saves' files: the new save replaces them
    own = _bytes(folder / CONFIG_FILE)
    if config is not None and config != own:
        write_bytes(folder / CONFIG_FILE, config)


def replaced_digest(folder: Path) -> str | None:
    """The digest of the config.json a save into ``folder`` replaces; None when there is none. A
    save into a hidden ``.*.partial`` folder is one step of a larger write into the folder that
    holds it (``export_artifact``'s forms are renamed out of it, config.json last): its
    config.json replaces that folder's."""
    if folder.name.startswith(".") and folder.name.endswith(PARTIAL):
        folder = folder.parent
    own = _bytes(folder / CONFIG_FILE)
    return None if own is None else digest(own)
