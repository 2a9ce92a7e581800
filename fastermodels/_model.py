"""FasterModel: a source factory, the rebuild spec of its layers, and its weights."""

import json
import os
import stat
from itertools import chain
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from huggingface_hub import PyTorchModelHubMixin, try_to_load_from_cache
from torch import nn

from fastermodels._errors import ArtifactNotFoundError, ArtifactReadError, SpecError, WeightsMismatchError
from fastermodels._files import artifact_file
from fastermodels._hub import download, hub_config, is_local
from fastermodels._weights import (CONFIG_DIGEST, CONFIG_FILE, REPLACED_DIGEST, WEIGHTS_FILE, digest, mismatch,
                                   paired_config, read_weights, replaced_digest, settle)
from uform.core import jsontext
from fastermodels._spec import rebuild, resolve, spec_from
from fastermodels._strict import check_state_dict
from fastermodels._trust import check_source

CONFIG_KEYS = ("source", "source_kwargs", "modules", "recipe", "provenance")


def read_config(path: str | os.PathLike[str], name: str | None = None) -> dict[str, Any]:
    """An artifact's config.json as a dict (:func:`parse_config`)."""
    with open(path, "rb") as f:
        return parse_config(f.read(), os.fspath(path) if name is None else name)


def parse_config(text: bytes, name: str) -> dict[str, Any]:
    """A config.json's bytes as a dict; ArtifactReadError names the file (``name``: a Hub file is
    named ``<repo id>/config.json``, not its cache path) and why it is not one."""
    try:
        config = jsontext.loads(text)
    except jsontext.NotJSON as e:
        raise ArtifactReadError(f"{name}: not JSON ({e}), so not a config.json") from None
    if not isinstance(config, dict):
        raise ArtifactReadError(f"{name}: holds a JSON {type(config).__name__}, not the object of "
                                "source, source_kwargs, modules, recipe and provenance")
    return config


def _take_dtypes(model: nn.Module, state: Mapping[str, Any]) -> None:
    """Give each parameter and buffer of ``model`` the dtype of its entry in ``state``, in place, so
    that loading copies the weights as they are instead of casting them to the factory's fp32. A
    parameter two modules share stays one parameter (a tied embedding stays tied)."""
    for key, tensor in chain(model.named_parameters(remove_duplicate=False),
                             model.named_buffers(remove_duplicate=False)):
        incoming = state.get(key)
        if isinstance(incoming, torch.Tensor) and incoming.dtype != tensor.dtype:
            tensor.data = tensor.data.to(incoming.dtype)


def _with_tied(model: nn.Module, state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with the entries it lacks for tensors ``model`` shares (a tied embedding): the
    mixin's ``save_model`` writes a shared tensor once, under one of its names, as safetensors
    allows no aliasing; ``safetensors.torch.load_model`` restores the others the same way."""
    names: dict[int, list[str]] = {}
    for key, tensor in chain(model.named_parameters(remove_duplicate=False),
                             model.named_buffers(remove_duplicate=False)):
        names.setdefault(id(tensor), []).append(key)
    filled = dict(state)
    for group in names.values():
        present = [k for k in group if k in state]
        for key in group:
            if present and key not in filled:
                filled[key] = state[present[0]]
    return filled


def _hub_paired(repo: str, recorded: tuple[str | None, str | None], hub: Mapping[str, Any]) -> bytes | None:
    """The cached config.json of a Hub repo (None when the cache holds none); ArtifactReadError
    when it is the one the save of the weights replaced (:func:`paired_config`)."""
    cached = try_to_load_from_cache(repo, CONFIG_FILE, cache_dir=hub.get("cache_dir"), revision=hub.get("revision"))
    if not isinstance(cached, str):
        return None
    text = Path(cached).read_bytes()
    saved, replaced = recorded
    if saved is not None and digest(text) == replaced:
        raise mismatch(f"{repo}/{CONFIG_FILE}", f"{repo}/{WEIGHTS_FILE}", digest(text), saved)
    return text


class FasterModel(nn.Module, PyTorchModelHubMixin,
                  library_name="fastermodels", tags=["fasterai"]):
    """A model optimized by fasterai: a source factory, the rebuild spec of its layers, and its weights.

    ``save_pretrained`` writes ``config.json`` (``source``, ``source_kwargs``, ``modules``,
    ``recipe``, ``provenance``) and ``model.safetensors`` (the weights under ``net.``);
    ``from_pretrained`` reads a directory or a Hub repo id, strictly, in eval mode.
    The spec is kept as ``self.spec`` (``nn.Module.modules`` is a method).
    """

    def __init__(self,
                 source: str,  # dotted path of the model factory
                 source_kwargs: dict[str, Any] | None = None,  # arguments the factory is called with
                 modules: dict[str, Any] | None = None,  # rebuild spec, as returned by `spec_from`
                 recipe: dict[str, Any] | None = None,  # the steps that produced the weights
                 provenance: dict[str, Any] | None = None,  # versions, commits, starting weights
                 ) -> None:
        super().__init__()
        self.source, self.source_kwargs, self.spec = source, source_kwargs, modules
        self.recipe, self.provenance = recipe, provenance
        factory = resolve(source)
        try:
            net = factory(**(source_kwargs or {}))
        except (TypeError, ValueError, RuntimeError) as e:
            raise SpecError(f"{source} cannot be built from source_kwargs {source_kwargs!r} "
                            f"({type(e).__name__}: {e})") from e
        self.net = rebuild(net, modules or {})

    @property
    def config(self) -> dict[str, Any]:
        """What ``config.json`` holds."""
        return {"source": self.source, "source_kwargs": self.source_kwargs, "modules": self.spec,
                "recipe": self.recipe, "provenance": self.provenance}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Delegate to ``self.net``."""
        return self.net(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True,
                        assign: bool = False) -> Any:
        """Load all or nothing: keys and shapes are checked before any tensor is copied.

        ``strict=False`` raises ValueError: FasterModel loading is always strict.
        """
        if not strict:
            raise ValueError("FasterModel loading is always strict")
        check_state_dict(self, state_dict)
        return super().load_state_dict(state_dict, strict=True, assign=assign)

    @classmethod
    def wrap(cls,
             model: nn.Module,  # the optimized model to publish
             source: str,  # dotted path of the model factory it came from
             source_kwargs: dict[str, Any] | None = None,  # arguments the factory is called with
             recipe: dict[str, Any] | None = None,  # the steps that produced the weights
             provenance: dict[str, Any] | None = None,  # versions, commits, starting weights
             ) -> "FasterModel":
        """Wrap an optimized model, reading its rebuild spec off its layers; returned in eval mode.

        The net is rebuilt from ``source`` and the spec and loaded strictly with ``model``'s
        weights, so what is published is proven to rebuild. Each tensor keeps its dtype (an fp16 or
        bf16 net is published as fp16 or bf16); the weights are copied.
        """
        fm = cls(source, source_kwargs, spec_from(model), recipe, provenance)
        state = {f"net.{k}": v for k, v in model.state_dict().items()}
        _take_dtypes(fm, state)
        fm.load_state_dict(state)
        return fm.eval()

    def save_pretrained(self, save_directory: str | Path, *, config: Any = None, repo_id: str | None = None,
                        push_to_hub: bool = False, model_card_kwargs: dict[str, Any] | None = None,
                        **push_to_hub_kwargs: Any) -> str | None:
        """The mixin's ``save_pretrained``, its files written whole or not at all: the mixin writes
        them into a hidden folder inside ``save_directory``, and only when every one is written are
        they renamed into place, ``config.json`` last (``uform.core.files``). The mixin on its own
        removes the old ``config.json`` first and writes the weights in place, so a save that failed
        (a full disk, a size limit, Ctrl-C) left the old artifact without its config, unloadable.
        A failed save raises ``OutputError`` naming the folder and leaves every old file as it was. As
        the mixin, a ``README.md`` already there is kept, and ``push_to_hub=True`` pushes afterwards."""
        from uform.core.files import OutputError, Outputs

        directory = Path(save_directory)
        settle(directory)  # a killed save's config.json put in place before its folder is swept
        self._replaced = replaced_digest(directory)  # recorded in the weights (fastermodels._weights)
        with Outputs() as out:
            out.folder(directory)
            scratch = out.scratch(directory)
            try:
                super().save_pretrained(scratch, config=config, model_card_kwargs=model_card_kwargs)
            except (OSError, safetensors.SafetensorError) as e:
                raise OutputError(f"{directory}: not saved ({e}); every old file is as it was") from None
            written = sorted(scratch.iterdir(), key=lambda p: (p.name == CONFIG_FILE, p.name))
            mode = stat.S_IMODE((scratch / CONFIG_FILE).stat().st_mode)  # written as the umask says
            for path in written:
                path.chmod(mode)  # safetensors writes its file 0600; a file there already keeps its own
                if path.name != "README.md" or not (directory / path.name).exists():
                    out.adopt(path, directory / path.name)
        if not push_to_hub:
            return None
        kwargs = dict(push_to_hub_kwargs)
        if config is not None:
            kwargs["config"] = config
        return self.push_to_hub(repo_id=repo_id or directory.name, model_card_kwargs=model_card_kwargs, **kwargs)

    def _save_pretrained(self, save_directory: Path) -> None:
        """model.safetensors through the mixin; config.json from the attributes, as the mixin writes it."""
        try:
            text = json.dumps(self.config, sort_keys=True, indent=2)
        except TypeError as e:
            raise TypeError(f"config.json must be JSON: {e} (source_kwargs, recipe and provenance "
                            "hold JSON values only)") from e
        # the weights record which config.json they pair with (fastermodels._weights)
        metadata = {CONFIG_DIGEST: digest(text.encode())}
        replaced = getattr(self, "_replaced", None)
        if replaced is not None and replaced != metadata[CONFIG_DIGEST]:
            metadata[REPLACED_DIGEST] = replaced
        safetensors.torch.save_model(self, str(save_directory / WEIGHTS_FILE), metadata=metadata)
        (save_directory / CONFIG_FILE).write_text(text)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path,
                        **kwargs: Any) -> "FasterModel":
        """The mixin's ``from_pretrained``, with the config.json read by :func:`read_config` first,
        a local one or a Hub one: ArtifactReadError names it when it is not a UTF-8 JSON object
        (the mixin's ``json.load`` would raise Python's bare ValueError, UnicodeDecodeError or
        RecursionError, or AttributeError for a list). The mixin then reads the file checked."""
        model_id = os.fspath(pretrained_model_name_or_path)
        if is_local(pretrained_model_name_or_path, model_id):  # a missing folder raises, unlooked-up
            config = artifact_file(model_id, CONFIG_FILE)  # a link out of it, a folder, a FIFO: named
            if config is not None:
                read_config(config)
        else:
            fetched = hub_config(model_id, kwargs)
            if fetched is not None:
                read_config(fetched, f"{model_id}/{CONFIG_FILE}")
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision: str | None,
                         cache_dir: str | Path | None, force_download: bool,
                         local_files_only: bool, token: str | bool | None,
                         map_location: str = "cpu", strict: bool = True,
                         trust_remote_code: bool = False,
                         **model_kwargs: Any) -> "FasterModel":
        """Rebuild from config.json, load model.safetensors strictly, return in eval mode.

        The ``source`` config.json names is imported and called only when it is a registered zoo
        builder with plain architecture arguments, unless ``trust_remote_code=True``
        (:func:`check_source`); the weights are read before the factory is called.
        """
        if not strict:
            raise ValueError("FasterModel loading is always strict")
        hub = {"revision": revision, "cache_dir": cache_dir, "force_download": force_download,
               "token": token, "local_files_only": local_files_only}
        if "source" in model_kwargs:  # refused before anything else is read (again below, once paired)
            check_source(model_kwargs["source"], model_kwargs.get("source_kwargs"), trust_remote_code, model_id)
        if os.path.isdir(model_id):
            local = artifact_file(model_id, WEIGHTS_FILE)
            if local is None:
                raise ArtifactNotFoundError(f"{model_id}: no {WEIGHTS_FILE}")
            state, recorded = read_weights(local)
            config = paired_config(Path(model_id), recorded)
        else:
            weights = download(model_id, WEIGHTS_FILE, hub)
            state, recorded = read_weights(weights)
            config = _hub_paired(model_id, recorded, hub)
        if config is not None:  # the config.json these weights were saved with, read again
            parsed = parse_config(config, os.path.join(model_id, CONFIG_FILE))
            model_kwargs.update({k: parsed[k] for k in CONFIG_KEYS if k in parsed})
        if "source" not in model_kwargs:
            raise ArtifactNotFoundError(f"{model_id}: no {CONFIG_FILE} naming a `source` factory")
        check_source(model_kwargs["source"], model_kwargs.get("source_kwargs"), trust_remote_code, model_id)
        try:
            model = cls._rebuilt(model_kwargs, state)
        except (SpecError, WeightsMismatchError) as e:
            raise type(e)(f"{model_id}: {e}") from e
        return model.to(map_location).eval()

    @classmethod
    def _rebuilt(cls, model_kwargs: dict[str, Any], state: Mapping[str, Any]) -> "FasterModel":
        """The model config.json describes, loaded with ``state``. Its keys and shapes are checked
        first on an outline built on the meta device, which allocates nothing: a config.json whose
        sizes disagree with the weights (``"num_classes": 10**9``, a spec entry of a million
        features) raises WeightsMismatchError instead of allocating and initialising its layers.
        A builder that cannot run on meta (torchvision's regnets read tensor values) skips the outline,
        as does a config.json the factory refuses: the real build raises its SpecError."""
        try:
            with torch.device("meta"):
                outline: FasterModel | None = cls(**model_kwargs)
        except Exception:  # noqa: BLE001 - not buildable on meta: the real build below raises or builds
            outline = None
        if outline is not None:
            check_state_dict(outline, _with_tied(outline, state))
        model = cls(**model_kwargs)
        state = _with_tied(model, state)
        check_state_dict(model, state)  # before the dtypes are taken: an int64 weight names itself
        _take_dtypes(model, state)  # an fp16 artifact loads as fp16
        model.load_state_dict(state)
        return model
