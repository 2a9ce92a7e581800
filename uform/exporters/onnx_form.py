"""The ONNX forms of a torch module: FP32 (a dynamic batch axis; past protobuf's 2 GiB its
weights gathered into one ``model.onnx.data`` beside it, readable as the model is) and INT8
(ONNX Runtime's dynamic quantization). torch, onnx and onnxruntime are imported inside the
functions only. The artifact that holds them is :mod:`uform.exporters.torch_forms`, which
re-exports these names."""

from __future__ import annotations

import logging
import os
import stat
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uform.core.files import Outputs

if TYPE_CHECKING:
    import torch

ONNX_OPSET = 17


def as_tuple(x: Any) -> tuple[torch.Tensor, ...]:
    """``x`` as a tuple of a module's inputs or outputs (a lone tensor is one)."""
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _names(prefix: str, n: int) -> list[str]:
    return [prefix] if n == 1 else [f"{prefix}_{i}" for i in range(n)]


@contextmanager
def quiet_torch_deprecations() -> Iterator[None]:
    """Silence deprecation notices (TorchScript, the TorchScript-based ONNX exporter) in the block."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def export_onnx(model: torch.nn.Module, path: str | Path, example_input: Any,
                *, opset: int = ONNX_OPSET) -> Path:
    """Write ``model`` as ONNX with a dynamic batch axis (dim 0 of every input and output)."""
    import onnx
    import torch

    if opset < 17:
        raise ValueError(f"opset must be at least 17, got {opset}")
    args = as_tuple(example_input)
    with torch.no_grad():
        n_out = len(as_tuple(model(*args)))
    inputs, outputs = _names("input", len(args)), _names("output", n_out)
    path = Path(path)
    # past protobuf's 2 GiB the exporter writes each weight to a file named after it, beside the
    # model: it writes into a folder of its own, and the weights are gathered into one `.data`;
    # both folders are in a scratch folder named after this process (a killed export's is swept
    # by the next write there), and the files are renamed into place only once checked
    with Outputs() as files:
        scratch = files.scratch(path.parent)
        (scratch / "exported").mkdir()
        (scratch / "gathered").mkdir()
        exported, kept = scratch / "exported" / path.name, scratch / "gathered" / path.name
        with quiet_torch_deprecations():
            torch.onnx.export(model, args, str(exported), dynamo=False, opset_version=opset,
                              input_names=inputs, output_names=outputs,
                              dynamic_axes={n: {0: "batch"} for n in inputs + outputs})
        gathered(exported, kept)
        onnx.checker.check_model(str(kept))
        data = external_data_name(path)
        if (kept.parent / data).exists():
            files.adopt(kept.parent / data, path.parent / data)
        elif (path.parent / data).is_file():  # an earlier model's weights: this one has none
            files.remove(path.parent / data)
        files.adopt(kept, path)  # last: it names its data file
    return path


def gathered(exported: Path, path: Path) -> None:
    """Save ``exported``, alone in its folder but for the weight files torch's exporter writes
    beside a model past 2 GiB (one a tensor, named after it), as ``path``: its weights inside,
    or, where it had such files, all in one ``model.onnx.data`` beside ``path``."""
    import onnx

    external = any(f != exported for f in exported.parent.iterdir())
    data = path.parent / external_data_name(path)
    if external:  # onnx appends to a data file that is there
        data.unlink(missing_ok=True)
    onnx.save(onnx.load(str(exported)), str(path), save_as_external_data=external,
              all_tensors_to_one_file=True, location=data.name)
    if data.exists():
        readable_as(data, path)


def readable_as(data: Path, model: Path) -> None:
    """Give ``data`` the permissions of ``model`` beside it: onnx writes external data owner-only
    (0600), so a model file others may read would name weights they could not."""
    os.chmod(data, stat.S_IMODE(os.stat(model).st_mode))


def external_data_name(path: str | Path) -> str:
    """The file beside ``path`` that holds an ONNX model's weights past 2 GiB: ``model.onnx.data``."""
    return f"{Path(path).name}.data"


class _DropPreprocessHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def quantize_int8(src: str | Path, dst: str | Path) -> Path:
    """Quantise an FP32 ONNX file to INT8 with ONNX Runtime (see `INT8_RECIPE`)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    hint = _DropPreprocessHint()
    logging.getLogger().addFilter(hint)
    external = (Path(src).parent / external_data_name(src)).exists()  # past 2 GiB: so is its INT8 form, maybe
    try:
        quantize_dynamic(Path(src), Path(dst), weight_type=QuantType.QInt8, per_channel=True,
                         use_external_data_format=external)
    finally:
        logging.getLogger().removeFilter(hint)
    if (Path(dst).parent / external_data_name(dst)).exists():
        readable_as(Path(dst).parent / external_data_name(dst), Path(dst))
    return Path(dst)
