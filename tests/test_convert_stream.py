"""The conversion's writer (uform/convert/write.py): the tensors cut into jobs that worker threads
check and cast from the source's memory map, written in order. The bytes do not depend on how
the work is cut or on how many threads do it; a NaN found in any job is named as the source's
check names it; a float32 value that BF16 cannot hold is refused, not written as an infinity."""

from __future__ import annotations

import hashlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("transformers")

from uform.convert import ConvertError, convert, write  # noqa: E402
from uform.core import safetensors  # noqa: E402
from uform.core.checkpoint import CheckpointFile  # noqa: E402


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def edited(source: Path, tmp_path: Path, name: str, index: int, value: float) -> Path:
    """A copy of ``source`` whose tensor ``name`` holds ``value`` at flat ``index``."""
    import shutil

    d = tmp_path / source.name
    shutil.copytree(source, d)
    with CheckpointFile(d / "model.safetensors") as f:
        tensors = {n: np.array(f.array(n)) for n in f.entries}
    tensors[name].reshape(-1)[index] = value
    safetensors.write(d / "model.safetensors", tensors, {"format": "pt"})
    return d


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_the_bytes_do_not_depend_on_how_the_work_is_cut(clip_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    convert(clip_dir, tmp_path / "default.safetensors", dtype=dtype)
    monkeypatch.setattr(write, "JOB", 1000)  # tensors cut into many jobs, ends not on a chunk's edge
    monkeypatch.setattr(write, "CHUNK", 96)
    monkeypatch.setattr(write, "BEHIND", 4096)  # the writeback hint on every few jobs
    for workers in (1, 3):
        monkeypatch.setattr(write, "available_cores", lambda workers=workers: workers)
        convert(clip_dir, tmp_path / f"cut-{workers}.safetensors", dtype=dtype)
        assert digest(tmp_path / f"cut-{workers}.safetensors") == digest(tmp_path / "default.safetensors")
    with CheckpointFile(tmp_path / "default.safetensors") as out, CheckpointFile(clip_dir / "model.safetensors") as src:
        got = out.array("text.embed.weight").astype(np.float32)
        want = src.array("text_model.embeddings.token_embedding.weight")
        assert np.array_equal(got, want.astype({"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}[dtype]).astype(np.float32))


def test_a_nan_in_a_later_job_is_named_by_the_source_check(clip_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = "text_model.embeddings.token_embedding.weight"  # [49408, 64]: many jobs of 1000 values
    d = edited(clip_dir, tmp_path, name, 123_457, np.nan)
    monkeypatch.setattr(write, "JOB", 1000)
    out = tmp_path / "out" / "x.safetensors"
    out.parent.mkdir()
    for dtype in ("bf16", "f16", "f32"):
        with pytest.raises(ConvertError, match=rf"tensor '{name}': holds NaN or infinite values \(the first, nan, at index \[1929, 1\]\)"):
            convert(d, out, dtype=dtype)
        assert list(out.parent.iterdir()) == []


def test_a_value_past_bf16s_range_is_refused_not_written_as_infinity(clip_dir: Path, tmp_path: Path) -> None:
    name = "vision_model.post_layernorm.weight"
    d = edited(clip_dir, tmp_path, name, 5, 3.4e38)  # finite in float32; rounds to BF16's infinity
    out = tmp_path / "out" / "x.safetensors"
    out.parent.mkdir()
    with pytest.raises(ConvertError, match=r"tensor 'image.ln_final.weight': holds values past BF16's range; convert with --dtype f32"):
        convert(d, out)
    with pytest.raises(ConvertError, match=r"holds values past float16's range \(65504\)"):
        convert(d, out, dtype="f16")
    assert list(out.parent.iterdir()) == []
    convert(d, out, dtype="f32")
    with CheckpointFile(out) as f:
        assert f.array("image.ln_final.weight")[5] == np.float32(3.4e38)
