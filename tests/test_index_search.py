"""uform.index's search and exports: remove and compact, every scalar, IVF against exact search,
scoring without a BLAS product, Parquet export and import, an index built by Ray. A tiny
checkpoint and pictures made on the spot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import uform
from uform.index import Index, IndexModelError, Text
from index_files import Reads, ckpt, embedding, model, photos, picture, stored  # noqa: F401 (fixtures)


def test_remove_and_compact(tmp_path: Path, ckpt: Path, model: uform.Model) -> None:
    root = photos(tmp_path / "photos", 6)
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([root], compact=False)
        assert ix.remove([root / "sub"]) == 3 and len(ix) == 3
        kept = stored(ix)
        assert ix.compact() == 3 and stored(ix).keys() == kept.keys()
        assert sorted(p.name for p in (tmp_path / "idx").glob("*.bin")) == ["kinds-1.bin", "vectors-1.bin"]
        for path, row in stored(ix).items():
            np.testing.assert_array_equal(row, kept[path])
        hits = ix.search_embedding(embedding(model, root / "p0.png"), 1)
        assert hits[0].path == str(root / "p0.png")


@pytest.mark.parametrize("scalar", ["f16", "bf16", "i8", "b1"])
def test_every_scalar_searches(tmp_path: Path, ckpt: Path, model: uform.Model, scalar: str) -> None:
    root = photos(tmp_path / "photos", 4)
    with Index(tmp_path / "idx", checkpoint=ckpt, outputs_scalar=scalar) as ix:
        ix.update([root])
        assert ix.search_embedding(embedding(model, root / "p2.png"), 1)[0].path == str(root / "p2.png")


def test_ivf_agrees_with_exact_and_finds_rows_added_after_it(tmp_path: Path, ckpt: Path, model: uform.Model) -> None:
    root = photos(tmp_path / "photos", 40)
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([root])
        assert ix.build_ivf(force=True)
        query = embedding(model, root / "p4.png")
        assert ix.search_embedding(query, 5, nprobe=16) == ix.search_embedding(query, 5, exact=True)
        picture(500).save(root / "late.png")
        ix.update([root])  # below MIN_ROWS the lists are not extended: the new row is past them, searched exactly
        late = ix.search_embedding(embedding(model, root / "late.png"), 1, nprobe=1)
        assert late[0].path == str(root / "late.png")


def test_parquet_export_and_import(tmp_path: Path, ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    root = photos(tmp_path / "photos", 3)
    with Index(tmp_path / "idx", checkpoint=ckpt) as ix:
        ix.update([root, Text("t1", "a red circle")])
        assert ix.export_parquet(tmp_path / "out.parquet") == 4
        rows = stored(ix)
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column_names == ["path", "modality", "hash", "model", "quantization", "embedding", "text"]
    assert str(table.schema.field("embedding").type) == "fixed_size_list<element: float>[32]"
    first = table.slice(0, 1).to_pylist()[0]
    assert first["model"] == ix.identity.checkpoint_sha256 and len(first["hash"]) == 32
    with Index(tmp_path / "copy", checkpoint=ckpt) as copy:
        assert copy.import_parquet(tmp_path / "out.parquet") == 4
        for path, row in stored(copy).items():
            np.testing.assert_array_equal(row, rows[path])
        reads = Reads(monkeypatch)
        result = copy.update([root])  # imported rows carry no stamp: read and hashed once, not embedded
        assert (result.touched, result.added, len(reads.paths)) == (3, 0, 3)


def test_an_index_built_by_ray_opens_here(tmp_path: Path, ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``uform.ray``'s rows (its Encoder's output through the batch ``index_rows`` maps) are the
    export's schema: imported, they are the rows this machine's update would have made."""
    pytest.importorskip("ray.data")
    pq = pytest.importorskip("pyarrow.parquet")
    from uform.index.parquet import ray_batch
    from uform.ray import Encoder

    root = photos(tmp_path / "photos", 3)
    paths = np.array([str(p) for p in sorted(root.rglob("*.png"))] + [str(root / "missing.png")], dtype=object)
    encoder = Encoder(str(ckpt), "image", "path", threads=1)
    try:
        out = encoder({"path": paths})
    finally:
        encoder.close()
    with Index(tmp_path / "mine", checkpoint=ckpt) as mine:
        mine.update([root])
        sha = mine.identity.checkpoint_sha256
        rows = stored(mine)
    table = ray_batch(out, path_column="path", column="path", modality="image", model=sha, quantization="bf16",
                      output_column="embedding", error_column="error")  # fmt: skip
    assert table.num_rows == 3  # the missing file's row carries an error: left out
    pq.write_table(table, tmp_path / "ray.parquet")
    with Index(tmp_path / "theirs", checkpoint=ckpt) as theirs:
        assert theirs.import_parquet(tmp_path / "ray.parquet") == 3
        for path, row in stored(theirs).items():
            np.testing.assert_allclose(row, rows[path], atol=1e-6)
        assert theirs.update([root]).added == 0
    with Index(tmp_path / "other", checkpoint=ckpt, quantization="e4m3") as other, pytest.raises(IndexModelError, match="bf16 weights"):
        other.import_parquet(tmp_path / "ray.parquet")


class _NoBlas(np.ndarray):
    """Rows that count the BLAS products (``@``) taken of them."""

    products = 0

    def __matmul__(self, other: Any) -> Any:
        type(self).products += 1
        return np.asarray(self) @ other


@pytest.mark.parametrize("scalar", ["f32", "f16", "i8"])
def test_probed_lists_are_scored_without_blas(scalar: str) -> None:
    """A clustered search scored each probed list (about 1,000 rows; 62 of them a query at a
    million rows) by a threaded BLAS product, which wakes its threads each call: 68-84 CPU ms
    and 134-170 ms a search on two busy cores. Blocks under scoring.BLOCK rows are now scored by
    numpy's own loop (11-14 CPU ms, 13-29 ms), the hits the same as an exact search's."""
    from uform.core.types import Scalar
    from uform.index import scoring
    from uform.index.update import store_rows

    from types import SimpleNamespace

    kind = Scalar(scalar)
    dtype = np.dtype([("q", np.int8, (16,)), ("s", np.float32)]) if kind is Scalar.I8 else np.dtype((np.float32 if kind is Scalar.F32 else np.float16, (16,)))
    store = SimpleNamespace(dtype=dtype, scalar=kind)

    rng = np.random.default_rng(0)
    unit = rng.standard_normal((3000, 16)).astype(np.float32)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    stored = store_rows(unit, store)  # type: ignore[arg-type]
    rows = stored.view(_NoBlas)
    kinds = np.ones(len(rows), np.uint8)
    q = scoring.prepare(unit[7], kind, 16)
    resolve = lambda slots: {s: (f"/p/{s}", None) for s in slots}  # noqa: E731
    _NoBlas.products = 0
    probed = scoring.search(resolve, rows, kinds, kind, 16, q, 5, None, [(0, 1000), (1000, 2000), (2000, 3000)])
    assert _NoBlas.products == 0
    everything = scoring.search(resolve, np.asarray(stored), kinds, kind, 16, q, 5, None, None)
    assert probed == everything and probed[0].path == "/p/7"


def test_an_exact_search_of_many_rows_takes_no_blas_product() -> None:
    """An exact search of F32 rows scored them by one BLAS product from scoring.BLOCK rows on, its
    threads woken for a memory-bound pass: 100-145 CPU ms at a million rows, where numpy's own
    loop a block at a time takes 79-111 (docs/index.md). Now every block is numpy's, the hits
    those of the rows' own arithmetic."""
    from uform.core.types import Scalar
    from uform.index import scoring

    rng = np.random.default_rng(0)
    unit = rng.standard_normal((scoring.BLOCK + 1000, 16)).astype(np.float32)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    rows = unit.view(_NoBlas)
    _NoBlas.products = 0
    hits = scoring.search(lambda slots: {s: (f"/p/{s}", None) for s in slots}, rows, np.ones(len(rows), np.uint8), Scalar.F32, 16,
                          scoring.prepare(unit[scoring.BLOCK + 7], Scalar.F32, 16), 3, None, None)  # fmt: skip
    assert _NoBlas.products == 0
    assert [h.path for h in hits] == [f"/p/{i}" for i in np.argsort(-(unit @ unit[scoring.BLOCK + 7]))[:3]]
    assert hits[0].score == pytest.approx(1, abs=1e-6)
