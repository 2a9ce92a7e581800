"""export_onnx called directly: its scratch is named after its writer and swept, its file written whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from uform.exporters import export_onnx  # noqa: E402

KILLED = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from uform.exporters import export_onnx

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    torch.onnx.export = killed
    export_onnx(torch.nn.Linear(4, 2), sys.argv[1], torch.zeros(1, 4))
    """
)


def test_a_killed_export_leaves_nothing_the_next_does_not_sweep(tmp_path: Path) -> None:
    """A kill -9 mid-export left its tempfile folder (.tmpXXXXXXXX.partial, a name no sweep
    takes) beside the model for good."""
    run = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "model.onnx")], check=False)
    assert run.returncode == -signal.SIGKILL
    (left,) = os.listdir(tmp_path)  # the killed writer's scratch, named after it
    assert left.startswith(".") and left.endswith(".partial")
    export_onnx(torch.nn.Linear(4, 2), tmp_path / "model.onnx", torch.zeros(1, 4))
    assert os.listdir(tmp_path) == ["model.onnx"]
    onnx.checker.check_model(str(tmp_path / "model.onnx"))


def test_a_failed_export_leaves_the_old_file_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker ran on the file already renamed over the old one: a model it refused replaced it."""
    path = tmp_path / "model.onnx"
    path.write_bytes(b"old model")

    def refuse(model: object) -> None:
        raise onnx.checker.ValidationError("refused")

    monkeypatch.setattr(onnx.checker, "check_model", refuse)
    with pytest.raises(onnx.checker.ValidationError, match="refused"):
        export_onnx(torch.nn.Linear(4, 2), path, torch.zeros(1, 4))
    assert path.read_bytes() == b"old model"
    assert os.listdir(tmp_path) == ["model.onnx"]


def test_an_export_without_external_weights_drops_an_earlier_data_file(tmp_path: Path) -> None:
    (tmp_path / "model.onnx.data").write_bytes(b"an earlier model's weights")
    export_onnx(torch.nn.Linear(4, 2), tmp_path / "model.onnx", torch.zeros(1, 4))
    assert os.listdir(tmp_path) == ["model.onnx"]
