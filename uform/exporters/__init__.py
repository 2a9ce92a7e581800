"""Exporters: tower → standalone ONNX; torch module → TorchScript / ONNX / safetensors."""

from uform.exporters.torch_forms import ARTIFACT_FILES as ARTIFACT_FILES
from uform.exporters.torch_forms import INT8_RECIPE as INT8_RECIPE
from uform.exporters.torch_forms import ExportMismatchError as ExportMismatchError
from uform.exporters.torch_forms import ExportReport as ExportReport
from uform.exporters.torch_forms import export_artifact as export_artifact
from uform.exporters.torch_forms import export_onnx as export_onnx
from uform.exporters.torch_forms import export_torchscript as export_torchscript
from uform.exporters.torch_forms import quantize_int8 as quantize_int8
from uform.exporters.torch_forms import quiet_torch_deprecations as quiet_torch_deprecations
