"""Torch module → artifact forms: safetensors, TorchScript, ONNX (FP32) and ONNX (INT8).

The artifact (``export_artifact``: the forms written whole or not at all, verified against
eager PyTorch) and the TorchScript form are here; the ONNX forms are
:mod:`uform.exporters.onnx_form`, whose names are re-exported here. torch is imported inside
the functions only, so that ``import uform.exporters`` never imports it (torch is not a
run-time dependency of uform).

TorchScript is *traced*, not scripted, by default: a traced graph is what the ONNX
exporter sees too, so both forms share one semantics; tracing works on any module a
factory returns (scripting fails on much ordinary Python); and the nets published here
are feed-forward, with no data-dependent control flow for a trace to freeze. Pass
``torchscript_mode="script"`` for a net whose control flow must survive.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uform.core.files import Outputs
from uform.exporters.onnx_form import ONNX_OPSET as ONNX_OPSET
from uform.exporters.onnx_form import as_tuple
from uform.exporters.onnx_form import export_onnx as export_onnx
from uform.exporters.onnx_form import external_data_name as external_data_name
from uform.exporters.onnx_form import gathered as gathered
from uform.exporters.onnx_form import quantize_int8 as quantize_int8
from uform.exporters.onnx_form import quiet_torch_deprecations as quiet_torch_deprecations
from uform.exporters.onnx_form import readable_as as readable_as

if TYPE_CHECKING:
    import torch

ARTIFACT_FILES: dict[str, str] = {
    "safetensors": "model.safetensors",
    "torchscript": "model.torchscript.pt",
    "onnx": "model.onnx",
}
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


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The net inside a FasterModel-like wrapper (``save_pretrained`` and a ``net``), else ``model``."""
    import torch

    net = getattr(model, "net", None)
    return net if hasattr(model, "save_pretrained") and isinstance(net, torch.nn.Module) else model


def _widened(net: torch.nn.Module, args: tuple[Any, ...]) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """``net`` and ``args`` for the FP32 forms: where either holds float16 or bfloat16 tensors, a copy
    of ``net`` widened to float32 (exactly: every half value is a float32 one) and ``args`` widened
    alike; otherwise both as they are. ``net`` itself is left as it was."""
    import torch

    half = (torch.float16, torch.bfloat16)
    if not any(isinstance(t, torch.Tensor) and t.dtype in half for t in (*net.parameters(), *net.buffers(), *args)):
        return net, args
    wide = [a.float() if isinstance(a, torch.Tensor) and a.dtype in half else a for a in args]
    return copy.deepcopy(net).float(), tuple(wide)


def export_torchscript(model: torch.nn.Module, path: str | Path, example_input: Any,
                       *, mode: str = "trace") -> Path:
    """Write ``model`` (in eval mode) as TorchScript: traced on ``example_input``, or scripted."""
    import torch

    if mode not in ("trace", "script"):
        raise ValueError(f"torchscript mode must be 'trace' or 'script', got {mode!r}")
    with quiet_torch_deprecations(), torch.no_grad():
        scripted = (torch.jit.trace(model, as_tuple(example_input))  # type: ignore[no-untyped-call]
                    if mode == "trace"
                    else torch.jit.script(model))
        torch.jit.save(scripted, str(path))
    return Path(path)


def _max_abs_diff(form: str, path: Path, args: tuple[torch.Tensor, ...],
                  reference: tuple[torch.Tensor, ...]) -> tuple[float, bool]:
    """Run the written file on ``args``; max abs diff to ``reference`` and whether it is in tolerance.
    Outputs of another number or shape than eager PyTorch's raise `ExportMismatchError` at once."""
    import numpy as np
    import torch

    if form == "torchscript":
        with torch.no_grad():
            with quiet_torch_deprecations():
                module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
            got = [t.cpu().numpy() for t in as_tuple(module(*args))]
    else:
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {i.name: a.cpu().numpy() for i, a in zip(session.get_inputs(), args)}
        got = [np.asarray(o) for o in session.run(None, feeds)]
    refs = [r.detach().cpu().numpy() for r in reference]
    shapes, eager = [tuple(g.shape) for g in got], [tuple(r.shape) for r in refs]
    if shapes != eager:  # numpy broadcasts: a (1, 1, 4) output passed as close to a (1, 4) one
        raise ExportMismatchError(f"{path.name}: outputs of shapes {shapes} where eager PyTorch gives "
                                  f"{eager}; nothing was written")
    diff = max(float(np.abs(g - r).max(initial=0.0)) for g, r in zip(got, refs))
    close = all(np.allclose(g, r, atol=ATOL, rtol=RTOL) for g, r in zip(got, refs))
    return diff, close


def _config_text(model: torch.nn.Module, int8: bool) -> str | None:
    """A FasterModel's config.json as an export writes it beside forms without safetensors."""
    config = getattr(model, "config", None)
    if not isinstance(config, dict):
        return None
    if int8:
        config = {**config, "recipe": {**(config.get("recipe") or {}), "int8": INT8_RECIPE}}
    return json.dumps(config, sort_keys=True, indent=2)


def _write_config(model: torch.nn.Module, directory: Path, int8: bool) -> None:
    """Beside forms without safetensors, keep a FasterModel's config.json for provenance."""
    text = _config_text(model, int8)
    if text is not None:
        (directory / "config.json").write_text(text)


def _check_weights_kept(model: torch.nn.Module, out: Path, forms: tuple[str, ...], int8: bool) -> None:
    """Refuse an export without safetensors whose config.json would replace the one an artifact's
    model.safetensors was saved with: loading would pair that config.json with those weights."""
    text, weights, old = _config_text(model, int8), out / ARTIFACT_FILES["safetensors"], out / "config.json"
    if "safetensors" in forms or text is None or not weights.exists():
        return
    try:
        same = old.read_bytes() == text.encode()
    except OSError:
        same = False
    if not same:
        raise ValueError(f"{weights}: weights this export's config.json (forms {list(forms)}) does not describe; "
                         "loading would take them for its model's: add 'safetensors' to forms, so that weights "
                         "and config.json are of one model, or export into another folder; nothing was written")


def export_artifact(model: torch.nn.Module, directory: str | Path,
                    forms: Sequence[str] | None = None, *, example_input: Any,
                    int8: bool = False, opset: int = ONNX_OPSET,
                    torchscript_mode: str = "trace", verify: bool = True) -> ExportReport:
    """Write the chosen ``forms`` of ``model`` into the artifact ``directory``.

    ``forms`` defaults to all three, or to ``("onnx",)`` when ``int8``: an INT8 variant is
    published as ``model.onnx`` alone, without ``model.safetensors``. The model is exported
    in eval mode and its training flag restored; a FasterModel's TorchScript and ONNX hold its
    ``net`` (names without the ``net.`` prefix). The TorchScript and ONNX forms are FP32: a net
    holding float16 or bfloat16 tensors is exported as a float32 copy (its own weights, widened
    exactly), traced on ``example_input`` widened alike; the safetensors form keeps its dtypes.
    With ``verify``, each written file is run on ``example_input`` and an FP32 form outside
    ``ATOL``/``RTOL`` of eager PyTorch (of that copy) raises `ExportMismatchError`.

    The forms are written whole or not at all (``uform.core.files``): each into a hidden folder
    inside ``directory``, checked there, and only when every one is written and verified are they
    renamed into place, ``config.json`` last. A failed export (a mismatch, an exporter's error, a
    full disk) leaves every old file of ``directory`` as it was. Without ``'safetensors'``, a
    FasterModel's config.json is written too, unless it would replace the one a model.safetensors
    there was saved with (ValueError before anything is written: loading would pair them).
    """
    import torch

    if isinstance(forms, str):  # a str is a sequence of letters: 'onnx' was "unknown form(s) ['o', 'n', 'n', 'x']"
        raise TypeError(f"forms takes a sequence of forms, e.g. ({forms!r},), not the string {forms!r}")
    forms = tuple(forms) if forms is not None else (("onnx",) if int8 else tuple(ARTIFACT_FILES))
    if not forms:  # it wrote a config.json alone, an artifact load() refuses
        raise ValueError(f"forms is empty: name at least one of {', '.join(ARTIFACT_FILES)} (or leave it out for all)")
    unknown = [f for f in forms if f not in ARTIFACT_FILES]
    if unknown:
        raise ValueError(f"unknown form(s) {unknown}; valid forms: {', '.join(ARTIFACT_FILES)}")
    if int8 and forms != ("onnx",):
        raise ValueError("an INT8 variant is ONNX only: pass forms=('onnx',) with int8=True")
    if "safetensors" in forms and not hasattr(model, "save_pretrained"):
        raise TypeError("the safetensors form needs a FasterModel (FasterModel.wrap(net, source, ...)):"
                        " a bare module cannot be rebuilt without its source and spec")
    if not os.fspath(directory):  # Path('') is the working folder
        raise ValueError("the artifact directory is empty: name the folder to write the forms to")
    out = Path(directory)
    _check_weights_kept(model, out, forms, int8)
    report = ExportReport(out, int8)
    was_training = model.training
    model.eval()
    try:
        net, args = _widened(_unwrapped(model), as_tuple(example_input))  # the forms are FP32
        with torch.no_grad():
            reference = as_tuple(net(*args))
        with Outputs() as files:  # every form written and checked first; then all renamed in, config.json last
            files.folder(out)
            scratch = files.scratch(out)
            for form in forms:
                path = scratch / ARTIFACT_FILES[form]
                if form == "safetensors":
                    model.save_pretrained(scratch)  # type: ignore[operator]
                elif form == "torchscript":
                    export_torchscript(net, path, args, mode=torchscript_mode)
                elif int8:
                    fp32 = export_onnx(net, files.scratch(out) / "fp32.onnx", args, opset=opset)
                    quantize_int8(fp32, path)
                else:
                    export_onnx(net, path, args, opset=opset)
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
            data = external_data_name(ARTIFACT_FILES["onnx"])
            if "onnx" in forms and not (scratch / data).exists():  # an earlier model.onnx's weights
                files.remove(out / data)
    finally:
        model.train(was_training)
    return report
