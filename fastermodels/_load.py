"""load: the form an artifact publishes, from a local directory or a Hub repo id."""

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from huggingface_hub import hf_hub_download, list_repo_files, try_to_load_from_cache

from fastermodels._errors import ArtifactNotFoundError, ArtifactReadError, UntrustedSourceError
from fastermodels._files import artifact_file, irregular, outside
from fastermodels._hub import HUB_KEYS as _HUB_KEYS
from fastermodels._hub import is_local as _is_local
from fastermodels._hub import not_cached
from fastermodels._hub import offline as _offline
from fastermodels._model import FasterModel
from uform.exporters import ARTIFACT_FILES, quiet_torch_deprecations

if TYPE_CHECKING:
    import onnx

FORMS: dict[str, str] = dict(ARTIFACT_FILES)  # form → file, in the order `load` looks for them
def _hub_files(repo_id: str, hub: dict[str, Any]) -> set[str]:
    """The repo's file names: listed on the Hub, or what the cache holds when offline."""
    if _offline(hub):
        return {name for name in FORMS.values() if isinstance(try_to_load_from_cache(
            repo_id, name, cache_dir=hub.get("cache_dir"), revision=hub.get("revision")), str)}
    return set(list_repo_files(repo_id, revision=hub.get("revision"), token=hub.get("token")))


def _fetch(repo_id: str, name: str, local: bool, files: set[str], hub: dict[str, Any]) -> Path:
    """Local path of ``name`` and of its external-data siblings (``name`` + ``.data`` etc.)."""
    if local:
        path = artifact_file(repo_id, name)  # a regular file in the folder, or ArtifactReadError naming it
        if path is None:
            raise ArtifactNotFoundError(f"{repo_id} publishes none of {name}")
        return path
    for sibling in sorted(f for f in files if f.startswith(name + ".")):
        hf_hub_download(repo_id, sibling, **hub)
    return Path(hf_hub_download(repo_id, name, **hub))


def _torchscript_refused(repo: str, files: set[str]) -> UntrustedSourceError:
    also = ", or form='onnx' for the model.onnx it also publishes" if FORMS["onnx"] in files else ""
    return UntrustedSourceError(
        f"{repo}: {FORMS['torchscript']} is TorchScript, which is code: torch.jit.load runs what its "
        "modules hold (a __setstate__ included) as it loads; pass trust_remote_code=True to load() "
        f"if you trust this artifact{also}; nothing was read")


def _load_torchscript(path: Path, map_location: Any) -> "torch.jit.ScriptModule":
    """``torch.jit.load``; ArtifactReadError names the file when it is not a TorchScript archive."""
    try:
        with quiet_torch_deprecations():
            module = torch.jit.load(str(path), map_location=map_location)  # type: ignore[no-untyped-call]
    except (RuntimeError, ValueError, OSError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ArtifactReadError(f"{path}: not a readable TorchScript archive ({reason})") from None
    return module.eval()  # type: ignore[no-any-return]


def _tensors(graph: "onnx.GraphProto") -> "Iterator[onnx.TensorProto]":
    """Every tensor ``graph`` holds: its initializers (sparse ones too) and its nodes' tensor
    attributes (a Constant's value), in its subgraphs (an If's branches, a Loop's body) too."""
    import onnx

    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield attribute.t
            elif attribute.type == onnx.AttributeProto.SPARSE_TENSOR:
                yield from (attribute.sparse_tensor.values, attribute.sparse_tensor.indices)
            yield from attribute.tensors
            for sub in (*attribute.graphs, *([attribute.g] if attribute.HasField("g") else [])):
                yield from _tensors(sub)


def _mentions(path: Path, word: bytes, chunk: int = 1 << 20) -> bool:
    """Whether the bytes of ``path`` hold ``word`` (an external-data entry's key is stored as
    written), read a chunk at a time; True when the file cannot be read (let the parse say why)."""
    try:
        with open(path, "rb") as f:
            tail = b""
            while block := f.read(chunk):
                if word in tail + block[: len(word) - 1] or word in block:
                    return True
                tail = block[-(len(word) - 1) :]
    except OSError:
        return True
    return False


def _check_external_data(path: Path, within: list[Path]) -> None:
    """Raise :class:`ArtifactReadError` unless every external-data location ``path`` names is a
    regular file in its own folder (:func:`outside`; ONNX Runtime reads each as the model's weights);
    only the graph is parsed, and only when the file holds an external-data entry at all."""
    import onnx

    if not _mentions(path, b"location"):  # no tensor names a file: the graph (and its weights) need not be parsed
        return
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and onnx's own: say the file is not ONNX
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ArtifactReadError(f"{path}: not a readable ONNX model ({reason})") from None
    if not model.HasField("graph"):
        raise ArtifactReadError(f"{path}: not a readable ONNX model (it holds no graph)")
    for tensor in _tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        why = outside(location, path.parent, within)
        if why is None and os.path.lexists(path.parent / location):
            why = irregular(path.parent / location)  # a FIFO or a device hangs the runtime reading it
        if why is not None:
            raise ArtifactReadError(
                f"{path}: tensor {tensor.name!r} keeps its data in {location!r}, {why}; an ONNX artifact's "
                "external data are files in its folder; nothing was read")


def load(repo_id: str | os.PathLike[str], form: str = "auto",
         **kw: Any) -> "FasterModel | torch.jit.ScriptModule | Path":
    """Load the form a repo publishes: a FasterModel, a TorchScript module, or the ONNX file's path.

    ``form='auto'`` looks for model.safetensors, then model.torchscript.pt, then model.onnx.
    TorchScript is code, so it is loaded only with ``trust_remote_code=True``; without it, an
    artifact whose first form is TorchScript raises :class:`UntrustedSourceError`.
    A local directory is read as is, never through the Hub; a missing one raises
    :class:`ArtifactNotFoundError` at once, and only a ``'namespace/name'`` string is looked
    up on the Hub (:func:`_is_local`). ``kw``: ``revision``, ``token``, ``cache_dir``,
    ``force_download``, ``local_files_only`` (Hub downloads), ``map_location`` (safetensors
    and TorchScript; default ``'cpu'``) and ``trust_remote_code`` (safetensors: import a
    ``source`` that is not a registered zoo builder; TorchScript: load it at all; default ``False``).
    """
    if form != "auto" and form not in FORMS:
        raise ValueError(f"form must be 'auto' or one of {', '.join(map(repr, FORMS))}, got {form!r}")
    unknown = sorted(set(kw) - {*_HUB_KEYS, "map_location", "trust_remote_code"})
    if unknown:
        raise TypeError(f"load() got unexpected keyword argument(s) {unknown}")
    hub = {k: v for k, v in kw.items() if k in _HUB_KEYS}
    repo = os.fspath(repo_id)
    local = _is_local(repo_id, repo)
    if local:
        files = set(os.listdir(repo))
    else:
        try:
            files = _hub_files(repo, hub)
        except Exception as e:  # noqa: BLE001 - whatever the Hub client says, say what was tried
            raise ArtifactNotFoundError(
                f"{repo}: no such local folder, and looking it up on the Hub as a repo id failed: "
                f"{type(e).__name__}: {e}") from e
    if not local and not files and _offline(hub):  # not "publishes none": nothing was asked of the Hub
        raise not_cached(repo, f"none of {', '.join(FORMS.values())}", False)
    for f in FORMS if form == "auto" else [form]:
        if FORMS[f] not in files:
            continue
        if f == "safetensors":
            return FasterModel.from_pretrained(repo, **kw)
        if f == "torchscript" and not kw.get("trust_remote_code"):
            raise _torchscript_refused(repo, files)
        path = _fetch(repo, FORMS[f], local, files, hub)
        if f == "torchscript":
            return _load_torchscript(path, kw.get("map_location", "cpu"))
        # in the Hub's cache a snapshot's files are links to the repo's blobs/ (models--ns--name/snapshots/REV/FILE)
        _check_external_data(path, [path.parent] if local else [path.parent, path.parent.parent.parent / "blobs"])
        return path  # onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    wanted = ", ".join(FORMS.values()) if form == "auto" else FORMS[form]
    raise ArtifactNotFoundError(f"{repo} publishes none of {wanted}"
                                + ("" if form == "auto" else f" (form={form!r})"))
