"""fastermodels: publish pruned PyTorch nets as safetensors, TorchScript and ONNX."""

from fastermodels._errors import (ArtifactNotFoundError, SpecError, UntrustedSourceError,
                                  WeightsMismatchError)
from fastermodels._hash import state_hash
from fastermodels._load import FORMS, load
from fastermodels._model import FasterModel
from fastermodels._spec import LAYER_TYPES, TRUSTED_SOURCES, check_source, resolve, spec_from
from uform.exporters import export_artifact

__all__ = ["ArtifactNotFoundError", "FORMS", "FasterModel", "LAYER_TYPES", "SpecError",
           "TRUSTED_SOURCES", "UntrustedSourceError", "WeightsMismatchError", "check_source",
           "export_artifact", "load", "resolve", "spec_from", "state_hash"]
