"""fastermodels: publish pruned PyTorch nets as safetensors, TorchScript and ONNX."""

from fastermodels._errors import (ArtifactNotFoundError, ArtifactReadError, SpecError,
                                  UntrustedSourceError, WeightsMismatchError)
from fastermodels._hash import state_hash
from fastermodels._load import FORMS, load
from fastermodels._model import FasterModel
from fastermodels._spec import LAYER_TYPES, resolve, spec_from
from fastermodels._trust import ARCHITECTURE_KWARGS, TRUSTED_SOURCES, WEIGHTS_KWARGS, check_source
from uform.exporters import export_artifact

__all__ = ["ARCHITECTURE_KWARGS", "ArtifactNotFoundError", "ArtifactReadError", "FORMS", "FasterModel",
           "LAYER_TYPES", "SpecError", "TRUSTED_SOURCES", "UntrustedSourceError", "WEIGHTS_KWARGS",
           "WeightsMismatchError", "check_source", "export_artifact", "load", "resolve", "spec_from",
           "state_hash"]
