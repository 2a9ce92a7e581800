"""Torch module → artifact forms: safetensors, TorchScript, ONNX (FP32) and ONNX (INT8).

torch is imported inside the functions only, so that ``import uform.exporters`` never
imports it (torch is not a run-time dependency of uform).

TorchScript is *traced*, not scripted, by default: a traced graph is what the ONNX
exporter sees too, so both forms share one semantics; tracing works on any module a
factory returns (scripting fails on much ordinary Python); and the nets published here
are feed-forward, with no data-dependent control flow for a trace to freeze. Pass
``torchscript_mode="script"`` for a net whose control flow must survive.
"""

from __future__ import annotations

import json
import logging
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uform.core.files import Outputs

if TYPE_CHECKING:
    import torch

ARTIFACT_FILES: dict[str, str] = {
    "safetensors": "model.safetensors",
    "torchscript": "model.torchscript.pt",
    "onnx": "model.onnx",
}
ONNX_OPSET = 17
ATOL = 1e-4  # FP32 forms must match eager PyTorch within atol + rtol * |reference|
RTOL = 1e-4
INT8_RECIPE = (
    "onnxruntime quantize_dynamic (QInt8, per_channel): Conv weights int8 per tensor, "
    "MatMul/Gemm weights int8 per output column, their input activations uint8 per tensor "
    "at run time; all else FP32"
)


class ExportMismatchError(RuntimeError):
    """An exported form's outputs differ from eager PyTorch by more than the tolerance."""


@dataclass(frozen=True)
class ExportReport:
    """What `export_artifact` wrote: form → file, and form → max abs diff to eager PyTorch."""

    directory: Path
    int8: bool = False
    files: dict[str, Path] = field(default_factory=dict)
    max_abs_diff: dict[str, float] = field(default_factory=dict)


def _as_tuple(x: Any) -> tuple[torch.Tensor, ...]:
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


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The net inside a FasterModel-like wrapper (``save_pretrained`` and a ``net``), else ``model``."""
    import torch

    net = getattr(model, "net", None)
    return net if hasattr(model, "save_pretrained") and isinstance(net, torch.nn.Module) else model


def export_torchscript(model: torch.nn.Module, path: str | Path, example_input: Any,
                       *, mode: str = "trace") -> Path:
    """Write ``model`` (in eval mode) as TorchScript: traced on ``example_input``, or scripted."""
    import torch

    if mode not in ("trace", "script"):
        raise ValueError(f"torchscript mode must be 'trace' or 'script', got {mode!r}")
    with quiet_torch_deprecations(), torch.no_grad():
        scripted = (torch.jit.trace(model, _as_tuple(example_input))  # type: ignore[no-untyped-call]
                    if mode == "trace"
                    else torch.jit.script(model))
        torch.jit.save(scripted, str(path))
    return Path(path)


def export_onnx(model: torch.nn.Module, path: str | Path, example_input: Any,
                *, opset: int = ONNX_OPSET) -> Path:
    """Write ``model`` as ONNX with a dynamic batch axis (dim 0 of every input and output)."""
    import onnx
    import torch

    if opset < 17:
        raise ValueError(f"opset must be at least 17, got {opset}")
    args = _as_tuple(example_input)
    with torch.no_grad():
        n_out = len(_as_tuple(model(*args)))
    inputs, outputs = _names("input", len(args)), _names("output", n_out)
    with quiet_torch_deprecations():
        torch.onnx.export(model, args, str(path), dynamo=False, opset_version=opset,
                          input_names=inputs, output_names=outputs,
                          dynamic_axes={n: {0: "batch"} for n in inputs + outputs})
    onnx.checker.check_model(str(path))
    return Path(path)


class _DropPreprocessHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def quantize_int8(src: str | Path, dst: str | Path) -> Path:
    """Quantise an FP32 ONNX file to INT8 with ONNX Runtime (see `INT8_RECIPE`)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    hint = _DropPreprocessHint()
    logging.getLogger().addFilter(hint)
    try:
        quantize_dynamic(Path(src), Path(dst), weight_type=QuantType.QInt8, per_channel=True)
    finally:
        logging.getLogger().removeFilter(hint)
    return Path(dst)


def _max_abs_diff(form: str, path: Path, args: tuple[torch.Tensor, ...],
                  reference: tuple[torch.Tensor, ...]) -> tuple[float, bool]:
    """Run the written file on ``args``; max abs diff to ``reference`` and whether it is in tolerance."""
    import numpy as np
    import torch

    if form == "torchscript":
        with torch.no_grad():
            with quiet_torch_deprecations():
                module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
            got = [t.cpu().numpy() for t in _as_tuple(module(*args))]
    else:
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {i.name: a.cpu().numpy() for i, a in zip(session.get_inputs(), args)}
        got = [np.asarray(o) for o in session.run(None, feeds)]
    refs = [r.detach().cpu().numpy() for r in reference]
    diff = max(float(np.abs(g - r).max(initial=0.0)) for g, r in zip(got, refs))
    close = all(np.allclose(g, r, atol=ATOL, rtol=RTOL) for g, r in zip(got, refs))
    return diff, close


def _write_config(model: torch.nn.Module, directory: Path, int8: bool) -> None:
    """Beside forms without safetensors, keep a FasterModel's config.json for provenance."""
    config = getattr(model, "config", None)
    if not isinstance(config, dict):
        return
    if int8:
        config = {**config, "recipe": {**(config.get("recipe") or {}), "int8": INT8_RECIPE}}
    (directory / "config.json").write_text(json.dumps(config, sort_keys=True, indent=2))


def export_artifact(model: torch.nn.Module, directory: str | Path,
                    forms: Sequence[str] | None = None, *, example_input: Any,
                    int8: bool = False, opset: int = ONNX_OPSET,
                    torchscript_mode: str = "trace", verify: bool = True) -> ExportReport:
    """Write the chosen ``forms`` of ``model`` into the artifact ``directory``.

    ``forms`` defaults to all three, or to ``("onnx",)`` when ``int8``: an INT8 variant is
    published as ``model.onnx`` alone, without ``model.safetensors``. The model is exported
    in eval mode and its training flag restored; a FasterModel's TorchScript and ONNX hold its
    ``net`` (names without the ``net.`` prefix). With ``verify``, each written file is run on
    ``example_input`` and an FP32 form outside ``ATOL``/``RTOL`` raises `ExportMismatchError`.

    The forms are written whole or not at all (``uform.core.files``): each into a hidden folder
    inside ``directory``, checked there, and only when every one is written and verified are they
    renamed into place, ``config.json`` last. A failed export (a mismatch, an exporter's error, a
    full disk) leaves every old file of ``directory`` as it was.
    """
    import torch

    forms = tuple(forms) if forms is not None else (("onnx",) if int8 else tuple(ARTIFACT_FILES))
    unknown = [f for f in forms if f not in ARTIFACT_FILES]
    if unknown:
        raise ValueError(f"unknown form(s) {unknown}; valid forms: {', '.join(ARTIFACT_FILES)}")
    if int8 and forms != ("onnx",):
        raise ValueError("an INT8 variant is ONNX only: pass forms=('onnx',) with int8=True")
    if "safetensors" in forms and not hasattr(model, "save_pretrained"):
        raise TypeError("the safetensors form needs a FasterModel (FasterModel.wrap(net, source, ...)):"
                        " a bare module cannot be rebuilt without its source and spec")
    out = Path(directory)
    args = _as_tuple(example_input)
    report = ExportReport(out, int8)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            reference = _as_tuple(model(*args))
        with Outputs() as files:  # every form written and checked first; then all renamed in, config.json last
            files.folder(out)
            scratch = files.scratch(out)
            for form in forms:
                path = scratch / ARTIFACT_FILES[form]
                if form == "safetensors":
                    model.save_pretrained(scratch)  # type: ignore[operator]
                elif form == "torchscript":
                    export_torchscript(_unwrapped(model), path, args, mode=torchscript_mode)
                elif int8:
                    with tempfile.TemporaryDirectory() as tmp:
                        fp32 = export_onnx(_unwrapped(model), Path(tmp) / "fp32.onnx", args, opset=opset)
                        quantize_int8(fp32, path)
                else:
                    export_onnx(_unwrapped(model), path, args, opset=opset)
                report.files[form] = out / path.name
                if verify and form != "safetensors":
                    diff, close = _max_abs_diff(form, path, args, reference)
                    report.max_abs_diff[form] = diff
                    if not close and not int8:
                        raise ExportMismatchError(f"{path.name}: max abs diff {diff:.3g} to eager PyTorch "
                                                  f"exceeds atol={ATOL}, rtol={RTOL}; nothing was written")
            if "safetensors" not in forms:
                _write_config(model, scratch, int8)
            for written in sorted(scratch.iterdir(), key=lambda p: (p.name == "config.json", p.name)):
                if written.name != "README.md" or not (out / written.name).exists():  # a card there is kept
                    files.adopt(written, out / written.name)
    finally:
        model.train(was_training)
    return report
