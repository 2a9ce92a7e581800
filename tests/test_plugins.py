"""The plugin host: documented hooks, third-party plugins, failures and conflicts."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

import uform
from uform.cli import main
from uform.core import checkpoint, hookspecs, plugin
from uform.core.host import get_host, reset_host

DOCS = Path(__file__).parent.parent / "docs" / "plugins.md"


def hooks() -> list[str]:
    return [n for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if hasattr(f, "uform_spec")]


def test_every_hook_and_argument_is_documented() -> None:
    doc = DOCS.read_text()
    assert hooks() == ["uform_backends", "uform_modalities"]
    for name in hooks():
        section = re.search(rf"### `{name}\((.*?)\)[^`]*`(.*?)(?=\n### |\n## |\Z)", doc, re.S)
        assert section, f"docs/plugins.md has no section for hook {name}"
        for param in inspect.signature(getattr(hookspecs, name)).parameters:
            assert f"`{param}`" in section.group(2), f"hook {name}: parameter {param} is undocumented"
        assert "Parameters:" in section.group(2)
    for record in (plugin.Modality, plugin.Tower, plugin.Backend, plugin.TensorSpec):
        for f in fields(record):
            assert f"`{f.name}`" in doc, f"{record.__name__}.{f.name} is undocumented in docs/plugins.md"


def example_plugin() -> str:
    """The third-party plugin that docs/plugins.md shows, verbatim."""
    block = re.search(r"```python\n# uform_smell/plugin.py\n(.*?)```", DOCS.read_text(), re.S)
    assert block
    return block.group(1)


def install(root: Path, dist: str, entry: str, modules: dict[str, str]) -> None:
    """A distribution as pip leaves it: modules plus a *.dist-info with entry_points.txt."""
    for name, source in modules.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[uform]\n{entry}\n")


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "site"
    root.mkdir()
    sys.path.insert(0, str(root))
    reset_host()
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.startswith(("uform_smell", "uform_broken", "uform_rival"))]:
            del sys.modules[name]
        reset_host()


def test_third_party_modality_is_found_and_used(site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    install(site, "uform-smell", "smell = uform_smell.plugin", {"uform_smell/__init__.py": "", "uform_smell/plugin.py": example_plugin()})
    assert "smell" in get_host().modalities
    config, tensors = checkpoint.new(get_host(), "tiny", 0, ["text", "smell"])
    checkpoint.save(tmp_path / "smelly.safetensors", config, tensors)
    model = uform.Model.load_ram(tmp_path / "smelly.safetensors")
    odours = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    enc = model.smell_encode(odours, uform.Arena())
    assert enc.embeddings.shape == (5, 32)
    np.testing.assert_allclose(np.linalg.norm(enc.embeddings, axis=1), 1, rtol=1e-5)
    with uform.Executor(1) as ex:
        assert np.array_equal(model.on(ex).smell_encode(odours, uform.Arena()).embeddings, enc.embeddings)
    assert model.text_encode(["still works"], uform.Arena()).embeddings.shape == (1, 32)
    assert main(["plugins", "--json"]) == 0
    listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert listed["smell"] == {
        "name": "smell", "distribution": "uform-smell", "version": "0.1", "kind": "modality",
        "status": "ok", "provides": ["smell"], "error": "",
    }  # fmt: skip


def test_broken_plugin_is_reported_and_skipped(site: Path, capsys: pytest.CaptureFixture[str], tiny_text: Path) -> None:
    install(site, "uform-broken", "broken = uform_broken", {"uform_broken/__init__.py": "raise ImportError('libsmell.so not found')"})
    with pytest.warns(RuntimeWarning, match="uform plugin 'broken' from uform-broken 0.1 is unusable.*libsmell.so not found"):
        host = get_host()
    assert {"text", "cpu"} <= set(host.modalities) | set(host.backends)
    assert uform.Model.load_ram(tiny_text).text_encode(["ok"], uform.Arena()).embeddings.shape == (1, 32)
    assert main(["plugins"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("broken"))
    assert "failed" in line and "ImportError: libsmell.so not found" in line


def test_hook_yielding_junk_is_reported(site: Path) -> None:
    source = "import uform\n@uform.hookimpl\ndef uform_backends():\n    yield 'not a backend'\n"
    install(site, "uform-broken", "junk = uform_broken", {"uform_broken/__init__.py": source})
    with pytest.warns(RuntimeWarning, match="yielded str, not Backend"):
        host = get_host()
    assert next(r for r in host.records if r.name == "junk").status == "failed"
    assert "cpu" in host.backends


def test_two_plugins_claiming_one_modality_conflict(site: Path) -> None:
    source = textwrap.dedent(
        """
        import uform
        from uform.plugins import text

        @uform.hookimpl
        def uform_modalities():
            yield from text.uform_modalities()
        """
    )
    install(site, "uform-rival", "rival = uform_rival", {"uform_rival/__init__.py": source})
    with pytest.raises(uform.PluginConflictError, match=r"modality 'text': .*uform .*and uform-rival \(plugin 'rival'\)|modality 'text': uform-rival .* and uform "):
        get_host()


def test_import_uform_stays_light() -> None:
    code = "import sys, uform; print(sorted(m for m in ('onnxruntime', 'av', 'torch', 'PIL') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_plugins_cli_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["name", "version", "kind", "status"]
    rows = {line.split()[0]: line for line in lines[1 : lines.index("")]}
    assert "backend" in rows["cpu"] and "ok" in rows["cpu"]
    assert "modality" in rows["text"] and "ok" in rows["text"]
    assert "  cpu (ram): available" in lines
