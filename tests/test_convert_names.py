"""``uform convert``'s names: a source directory whose name is not printable text (a byte not
UTF-8, a line break) is refused by name rather than recorded as the file's source, and the
summary line prints ``OUT`` as names print (docs/cli.md "Names printed"); an ``OUT`` that is the
source's own weights is refused, ``force`` or not."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from uform.cli import main  # noqa: E402
from uform.convert import ConvertError, convert  # noqa: E402


def test_a_directory_name_that_is_not_printable_is_refused_unless_named(clip_dir: Path, tmp_path: Path) -> None:
    for odd in (b"tiny\xffclip".decode("utf-8", "surrogateescape"), "tiny\nclip"):
        source = tmp_path / odd
        shutil.copytree(clip_dir, source)
        out = tmp_path / "out.safetensors"
        with pytest.raises(ConvertError, match=r"its name is not printable text, which the file would record as its source; give one \(name=\.\.\., uform convert --name\)$"):
            convert(source, out)
        assert not out.exists()
        assert convert(source, out, name="tiny-clip").name == "tiny-clip"
        out.unlink()


def test_the_summary_prints_out_as_names_print(clip_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    out = b"y\xff\n.safetensors".decode("utf-8", "surrogateescape")
    assert main(["convert", str(clip_dir), out, "--dtype", "f32"]) == 0
    line = capsys.readouterr().out
    assert line.startswith("wrote y\\xff\\n.safetensors: clip (CLIPModel) from tiny-clip, ") and line.count("\n") == 1
    line.encode("utf-8")  # a strict UTF-8 stdout takes it (a lone surrogate failed there, after the file was written)
    assert Path(out).is_file()


def test_out_that_is_the_sources_weights_is_refused_even_forced(clip_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(clip_dir, source)
    (source / "link.safetensors").symlink_to("model.safetensors")
    before = (source / "model.safetensors").read_bytes()
    for out in ("model.safetensors", "link.safetensors"):  # it was replaced by the converted file, the source lost
        with pytest.raises(ConvertError, match=rf"^{source / out}: is the source's own weights, which this conversion reads; give another OUT$"):
            convert(source, source / out, force=True)
    assert (source / "model.safetensors").read_bytes() == before and sorted(p.name for p in source.iterdir()) == sorted([*(p.name for p in clip_dir.iterdir()), "link.safetensors"])
    assert convert(source, source / "beside.safetensors").out == source / "beside.safetensors"


def test_out_that_is_another_file_the_source_reads_is_refused_even_forced(clip_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(clip_dir, source)
    (source / "link.json").symlink_to("tokenizer.json")
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    for out, what in (("config.json", "config.json"), ("tokenizer.json", "tokenizer.json"), ("preprocessor_config.json", "preprocessor_config.json"), ("link.json", "tokenizer.json")):
        # --force replaced it by the converted file: a source with a safetensors file for its config no longer converts
        with pytest.raises(ConvertError, match=rf"^{source / out}: is the source's own {what}, which this conversion reads; give another OUT$"):
            convert(source, source / out, force=True)
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before
    assert main(["convert", str(source), str(source / "config.json"), "--force"]) == 2
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before
