"""fastermodels: publish pruned PyTorch nets as safetensors, TorchScript and ONNX."""

from fastermodels._errors import ArtifactNotFoundError, SpecError, WeightsMismatchError
from fastermodels._hash import state_hash
from fastermodels._load import FORMS, load
from fastermodels._model import FasterModel
from fastermodels._spec import LAYER_TYPES, resolve, spec_from
from uform.exporters import export_artifact

__all__ = ["ArtifactNotFoundError", "FORMS", "FasterModel", "LAYER_TYPES", "SpecError",
           "WeightsMismatchError", "export_artifact", "load", "resolve", "spec_from", "state_hash"]
