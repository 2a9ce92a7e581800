"""FasterModel: a source factory, the rebuild spec of its layers, and its weights."""

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
from huggingface_hub import PyTorchModelHubMixin, hf_hub_download
from torch import nn

from fastermodels._errors import ArtifactNotFoundError
from fastermodels._spec import check_source, rebuild, resolve, spec_from
from fastermodels._strict import check_state_dict

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


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
        self.net = rebuild(resolve(source)(**(source_kwargs or {})), modules or {})

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
        weights, so what is published is proven to rebuild.
        """
        fm = cls(source, source_kwargs, spec_from(model), recipe, provenance)
        fm.load_state_dict({f"net.{k}": v for k, v in model.state_dict().items()})
        return fm.eval()

    def _save_pretrained(self, save_directory: Path) -> None:
        """model.safetensors through the mixin; config.json from the attributes, as the mixin writes it."""
        try:
            text = json.dumps(self.config, sort_keys=True, indent=2)
        except TypeError as e:
            raise TypeError(f"config.json must be JSON: {e} (source_kwargs, recipe and provenance "
                            "hold JSON values only)") from e
        super()._save_pretrained(save_directory)
        (save_directory / CONFIG_FILE).write_text(text)

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision: str | None,
                         cache_dir: str | Path | None, force_download: bool,
                         local_files_only: bool, token: str | bool | None,
                         map_location: str = "cpu", strict: bool = True,
                         trust_remote_code: bool = False,
                         **model_kwargs: Any) -> "FasterModel":
        """Rebuild from config.json, load model.safetensors strictly, return in eval mode.

        The ``source`` config.json names is imported only from :data:`TRUSTED_SOURCES`
        unless ``trust_remote_code=True`` (:func:`check_source`).
        """
        if not strict:
            raise ValueError("FasterModel loading is always strict")
        if "source" not in model_kwargs:
            raise ArtifactNotFoundError(f"{model_id}: no {CONFIG_FILE} naming a `source` factory")
        check_source(model_kwargs["source"], model_kwargs.get("source_kwargs"), trust_remote_code, model_id)
        model = cls(**model_kwargs)
        if os.path.isdir(model_id):
            weights = os.path.join(model_id, WEIGHTS_FILE)
            if not os.path.isfile(weights):
                raise ArtifactNotFoundError(f"{model_id}: no {WEIGHTS_FILE}")
        else:
            weights = hf_hub_download(repo_id=model_id, filename=WEIGHTS_FILE, revision=revision,
                                      cache_dir=cache_dir, force_download=force_download,
                                      token=token, local_files_only=local_files_only)
        model.load_state_dict(safetensors.torch.load_file(weights))
        return model.to(map_location).eval()
