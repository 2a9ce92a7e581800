"""The plugin host: documented hooks, third-party plugins, failures and conflicts."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

import uform
from uform.cli import main
from uform.core import checkpoint, hookspecs, plugin
from uform.core.host import Host, get_host, reset_host

from sites import install, logged, site  # noqa: F401 - site is a fixture

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
    with logged("uform plugin 'broken' from uform-broken 0.1 is unusable.*libsmell.so not found"):
        host = get_host()
    assert {"text", "cpu"} <= set(host.modalities) | set(host.backends)
    assert uform.Model.load_ram(tiny_text).text_encode(["ok"], uform.Arena()).embeddings.shape == (1, 32)
    assert main(["plugins"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("broken"))
    assert "failed" in line and "ImportError: libsmell.so not found" in line


def test_hook_yielding_junk_is_reported(site: Path) -> None:
    source = "import uform\n@uform.hookimpl\ndef uform_backends():\n    yield 'not a backend'\n"
    install(site, "uform-broken", "junk = uform_broken", {"uform_broken/__init__.py": source})
    with logged("yielded str, not Backend"):
        host = get_host()
    assert next(r for r in host.records if r.name == "junk").status == "failed"
    assert "cpu" in host.backends


RIVAL_TEXT = textwrap.dedent(
    """
    import uform
    from uform.plugins import text

    @uform.hookimpl
    def uform_modalities():
        yield from text.uform_modalities()
    """
)


def test_a_conflict_is_recorded_and_only_loads_needing_the_name_fail(
    site: Path, tmp_path: Path, tiny_text: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    install(site, "uform-rival", "rival = uform_rival", {"uform_rival/__init__.py": RIVAL_TEXT})
    install(site, "uform-smell", "smell = uform_smell.plugin", {"uform_smell/__init__.py": "", "uform_smell/plugin.py": example_plugin()})
    host = get_host()  # no longer raises: the conflict is recorded
    assert "text" not in host.modalities and {"smell", "image"} <= set(host.modalities)
    (conflict,) = host.conflicts
    assert conflict.names == (("modality", "text"), ("tower", "text"), ("verb", "text_encode"))
    assert {c.plugin for c in conflict.claimants} == {"text", "rival"}
    records = {r.name: r for r in host.records}
    assert records["rival"].status == records["text"].status == "conflict"
    assert "uform-rival 0.1 (plugin 'rival')" in records["text"].error and "UFORM_BLOCK_PLUGINS=rival" in records["text"].error
    assert records["smell"].status == "ok"

    config, tensors = checkpoint.new(host, "tiny", 0, ["smell"])
    checkpoint.save(tmp_path / "smell.safetensors", config, tensors)
    odours = np.ones((2, 16), np.float32)
    assert uform.Model.load_ram(tmp_path / "smell.safetensors").smell_encode(odours, uform.Arena()).embeddings.shape == (2, 32)
    with pytest.raises(uform.PluginConflictError) as err:
        uform.Model.load_ram(tiny_text)
    message = str(err.value)
    assert message.startswith("tower 'text': ")
    assert "both claim the modality 'text', the tower 'text' and the verb 'text_encode'; neither claim is used" in message
    assert "(plugin 'rival')" in message and "(plugin 'text')" in message and "UFORM_BLOCK_PLUGINS=" in message

    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "conflicts:" in out
    assert next(x for x in out.splitlines() if x.startswith("rival")).split()[4] == "conflict"


def test_a_contested_verb_the_checkpoint_lacks_is_a_conflict_not_a_missing_plugin(site: Path, tmp_path: Path) -> None:
    """An image-only checkpoint loads beside a contested text plugin; its text_encode names the
    conflict (docs/architecture.md, "Plugins"), directly and through a receiver alike."""
    host = get_host()
    config, tensors = checkpoint.new(host, "tiny", 0, ["image"])
    checkpoint.save(tmp_path / "image.safetensors", config, tensors)
    model = uform.Model.load_ram(tmp_path / "image.safetensors")
    with pytest.raises(uform.UnsupportedError, match=r"^text_encode needs the 'text' tower, which this checkpoint does not have \(it has: image\)$"):
        model.text_encode(["a"], uform.Arena())
    install(site, "uform-rival", "rival = uform_rival", {"uform_rival/__init__.py": RIVAL_TEXT})
    reset_host()
    model = uform.Model.load_ram(tmp_path / "image.safetensors")
    pattern = r"^verb 'text_encode': .*both claim the modality 'text', the tower 'text' and the verb 'text_encode'; neither claim is used"
    with pytest.raises(uform.PluginConflictError, match=pattern):
        model.text_encode(["a"], uform.Arena())
    with uform.Executor(1) as executor, pytest.raises(uform.PluginConflictError, match=pattern):
        model.on(executor).text_encode(["a"], uform.Arena())


def test_a_contested_backend_fails_only_loads_of_its_placement(site: Path, tiny_text: Path) -> None:
    rival = "import uform\nfrom uform.plugins import cpu\n@uform.hookimpl\ndef uform_backends():\n    yield from cpu.uform_backends()\n"
    install(site, "uform-rival", "rival = uform_rival", {"uform_rival/__init__.py": rival})
    with pytest.raises(uform.PluginConflictError, match=r"placing in RAM: .*\(plugin '(cpu|rival)'\) and .*\(plugin '(cpu|rival)'\) both claim the backend 'cpu'"):
        uform.Model.load_ram(tiny_text)
    assert "text" in get_host().modalities


def test_blocked_plugins_are_not_loaded(site: Path, tiny_text: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    install(site, "uform-rival", "rival = uform_rival", {"uform_rival/__init__.py": RIVAL_TEXT})
    monkeypatch.setenv("UFORM_BLOCK_PLUGINS", " rival ,")
    host = get_host()
    assert host.conflicts == [] and "text" in host.modalities
    rival = next(r for r in host.records if r.name == "rival")
    assert (rival.status, rival.error) == ("blocked", "blocked by UFORM_BLOCK_PLUGINS or Host(blocked=...)")
    assert uform.Model.load_ram(tiny_text).text_encode(["ok"], uform.Arena()).embeddings.shape == (1, 32)
    assert main(["plugins"]) == 0
    assert next(x for x in capsys.readouterr().out.splitlines() if x.startswith("rival")).split()[4] == "blocked"


def test_blocking_an_unknown_name_warns(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UFORM_BLOCK_PLUGINS", "rivl")
    with logged("UFORM_BLOCK_PLUGINS names 'rivl', which no installed uform plugin is called"):
        get_host()


def test_host_blocks_by_argument() -> None:
    host = Host(blocked=["cuda"])
    host.discover()
    assert "cuda" not in host.backends and "cpu" in host.backends
    assert next(r for r in host.records if r.name == "cuda").status == "blocked"


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (
            "import uform\n@uform.hookimpl\ndef uform_modalites():\n    return []\n",
            "unknown hook 'uform_modalites' (did you mean 'uform_modalities'?): uform's hooks are uform_backends, uform_modalities; "
            "a hook of a newer uform is marked @uform.hookimpl(optionalhook=True)",
        ),
        (
            "CALLED = []\ndef uform_backends():\n    CALLED.append(1)\n    return []\n",
            "uform_backends is not marked with @uform.hookimpl, so uform never calls it; mark it",
        ),
        (
            "import uform\n@uform.hookimpl\ndef uform_backends(device):\n    return []\n",
            "uform_backends names 'device', which the hook does not pass in this uform "
            "(hookspec version 1: uform_backends takes no arguments); upgrade uform or drop the argument",
        ),
    ],
    ids=["misspelled", "unmarked", "unknown-argument"],
)
def test_a_plugin_not_matching_the_hookspecs_fails_naming_why(site: Path, source: str, reason: str) -> None:
    install(site, "uform-broken", "odd = uform_broken", {"uform_broken/__init__.py": source})
    with logged("uform plugin 'odd' from uform-broken 0.1 is unusable"):
        host = get_host()
    record = next(r for r in host.records if r.name == "odd")
    assert (record.status, record.error) == ("failed", reason)
    assert getattr(sys.modules["uform_broken"], "CALLED", []) == []  # an unmarked hook is never called
    assert {"text", "cpu"} <= set(host.modalities) | set(host.backends)


def test_a_hook_of_a_newer_uform_marked_optional_is_ignored(site: Path) -> None:
    source = textwrap.dedent(
        """
        import uform
        from uform.plugins import text

        @uform.hookimpl(optionalhook=True)
        def uform_future_hook(model):
            raise AssertionError("an unknown optional hook is never called")

        @uform.hookimpl
        def uform_backends():
            return []
        """
    )
    install(site, "uform-broken", "future = uform_broken", {"uform_broken/__init__.py": source})
    record = next(r for r in get_host().records if r.name == "future")
    assert (record.status, record.kind, record.error) == ("ok", "", "")


def test_hooks_are_called_through_the_plugin_manager() -> None:
    """pluggy's call monitoring sees every hook call the host makes, one plugin at a time."""
    from uform.plugins import cpu

    calls: list[tuple[str, list[str]]] = []
    host = Host()
    host.manager.add_hookcall_monitoring(lambda hook, impls, kwargs: calls.append((hook, [i.plugin_name for i in impls])), lambda *a: None)
    host.add(cpu, "cpu", "uform")
    assert calls == [("uform_modalities", []), ("uform_backends", ["cpu"])]
    assert list(host.backends) == ["cpu"]


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


BACKEND = "import uform\nfrom uform.core.plugin import Backend, Modality, Tower\nfrom uform.plugins import text\n@uform.hookimpl\n"


@pytest.mark.parametrize(
    ("hook", "reason"),
    [
        (
            "def uform_modalities():\n    yield Modality('bad', None, {})\n",
            "uform_modalities yielded the Modality 'bad' whose tower is None, not a Tower",
        ),
        (
            "def uform_modalities():\n    t = next(iter(text.uform_modalities())).tower\n"
            "    yield Modality('odd', Tower('odd', t.read, t.tensors, t.graph, t.presets), {'odd_encode': 'fn', '_hidden': print})\n",
            "uform_modalities yielded the Modality 'odd' whose verbs['odd_encode'] is 'fn', not callable; "
            "a verb's name is '_hidden', not an identifier that does not start with '_' and is not a name of Model's own (describe, close, ...)",
        ),
        (
            "def uform_modalities():\n    t = next(iter(text.uform_modalities())).tower\n"
            "    yield Modality('odd', Tower('odd', t.read, t.tensors, t.graph, t.presets), {'describe': print})\n",
            "uform_modalities yielded the Modality 'odd' whose a verb's name is 'describe', not an identifier that does not start with '_' "
            "and is not a name of Model's own (describe, close, ...)",
        ),
        (
            "def uform_backends():\n    yield Backend('gpu0', 'gpu', lambda: None, lambda r: None, priority='high')\n",
            "uform_backends yielded the Backend 'gpu0' whose placement is 'gpu', not 'ram' or 'vram'; priority is 'high', not an int",
        ),
        (
            "def uform_backends():\n    b = Backend('twice', 'ram', lambda: None, lambda r: None)\n    return [b, b]\n",
            "uform_backends yielded the backend 'twice' twice; each name is one record",
        ),
        (
            "def uform_modalities():\n    return next(iter(text.uform_modalities()))\n",
            "uform_modalities returned Modality, not an iterable of records",
        ),
        ("def uform_backends():\n    raise RuntimeError('no licence')\n", "uform_backends raised RuntimeError: no licence"),
        ("def uform_backends():\n    raise SystemExit('gave up')\n", "uform_backends raised SystemExit: gave up"),
    ],
    ids=["tower-none", "verbs", "model-name", "placement", "duplicate", "not-iterable", "raises", "exits"],
)
def test_a_malformed_record_fails_its_plugin_not_uform(site: Path, hook: str, reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, a Modality without a Tower was a traceback of every load and of `uform plugins`, a
    Backend of placement 'gpu' was listed as available and never used, duplicates went unnoticed."""
    install(site, "uform-broken", "odd = uform_broken", {"uform_broken/__init__.py": BACKEND + hook})
    with logged("uform plugin 'odd' from uform-broken 0.1 is unusable"):
        host = get_host()
    record = next(r for r in host.records if r.name == "odd")
    assert (record.status, record.error) == ("failed", reason)
    assert {"text", "cpu"} <= set(host.modalities) | set(host.backends)
    assert main(["plugins"]) == 0
    assert f"failed  {reason}" in capsys.readouterr().out


def test_a_plugin_exiting_at_import_is_skipped(site: Path, tiny_text: Path) -> None:
    install(site, "uform-broken", "quits = uform_broken", {"uform_broken/__init__.py": "import sys\nsys.exit('no licence file')\n"})
    with logged("'quits' from uform-broken 0.1 is unusable and was skipped: import failed: SystemExit: no licence file"):
        get_host()
    assert uform.Model.load_ram(tiny_text).text_encode(["ok"], uform.Arena()).embeddings.shape == (1, 32)


@pytest.mark.parametrize(
    ("probe", "reason"),
    [
        ("raise RuntimeError('driver exploded')", "its probe raised RuntimeError: driver exploded"),
        ("return False", "its probe answered False, not None (available) or a reason (str)"),
        ("import sys; sys.exit('no GPU driver')", "its probe raised SystemExit: no GPU driver"),
    ],
    ids=["raises", "answers-bool", "exits"],
)
def test_a_broken_probe_passes_its_backend_over(
    site: Path, tiny_text: Path, probe: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A probe that raises was a traceback of every load_ram and of `uform plugins`; one answering
    False was taken as available; one calling sys.exit ended the program (`uform plugins` stopped
    after 'backends:', exit status 1)."""
    source = BACKEND + f"def uform_backends():\n    def probe():\n        {probe}\n    def place(r):\n        raise AssertionError('never opened')\n"
    source += "    yield Backend('boom', 'ram', probe, place, priority=50)\n"
    install(site, "uform-broken", "boom = uform_broken", {"uform_broken/__init__.py": source})
    model = uform.Model.load_ram(tiny_text)
    assert model.backend in ("e4m3", "cpu")
    fix = "uform-broken 0.1 (plugin 'boom') has a bug: report it there, or block it with UFORM_BLOCK_PLUGINS=boom"
    assert get_host().probe(get_host().backends["boom"]) == f"{reason}; {fix}"
    assert main(["plugins"]) == 0
    assert f"  boom (ram): unavailable: {reason}; {fix}" in capsys.readouterr().out.splitlines()


def test_two_distributions_may_share_an_entry_point_name(site: Path, tiny_text: Path) -> None:
    """A third-party entry point named 'text' made the built-in text plugin fail ('Plugin name
    already registered', pluggy's table of every plugin) and text_encode disappear."""
    install(site, "uform-rival", "text = uform_rival", {"uform_rival/__init__.py": BACKEND + "def uform_backends():\n    return []\n"})
    host = get_host()
    records = [(r.distribution, r.status, r.provides) for r in host.records if r.name == "text"]
    assert sorted(records) == [("uform", "ok", ("text",)), ("uform-rival", "ok", ())]
    assert uform.Model.load_ram(tiny_text).text_encode(["ok"], uform.Arena()).embeddings.shape == (1, 32)


def test_two_plugins_of_one_name_and_one_claim_say_blocking_blocks_both(site: Path) -> None:
    install(site, "uform-rival", "text = uform_rival", {"uform_rival/__init__.py": RIVAL_TEXT})
    (conflict,) = get_host().conflicts
    assert conflict.message().endswith("neither claim is used. Uninstall one (UFORM_BLOCK_PLUGINS=text would block both)")


def test_one_module_declared_twice_is_one_plugin(site: Path) -> None:
    source = BACKEND + "def uform_backends():\n    yield Backend('twin', 'ram', lambda: 'never here', lambda r: None)\n"
    install(site, "uform-broken", "one = uform_broken\nanother = uform_broken", {"uform_broken/__init__.py": source})
    with logged("'one' from uform-broken 0.1 is unusable"):
        host = get_host()
    records = {r.name: r for r in host.records}
    assert records["one"].error == (
        "its module 'uform_broken' is registered already, as plugin 'another'; a module is one plugin: declare one entry point for it"
    )
    assert (records["another"].status, records["another"].provides) == ("ok", ("twin",))
    assert host.manager.get_plugin("another") is sys.modules["uform_broken"]  # it stays registered


def test_plugins_table_prints_an_error_on_one_line(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    install(site, "uform-broken", "odd = uform_broken", {"uform_broken/__init__.py": "raise ImportError('line one\\nline two \\x1b[31m')\n"})
    with logged():
        assert main(["plugins"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("odd"))
    assert line.endswith("failed  import failed: ImportError: line one\\nline two \\x1b[31m")


def test_blocked_backends_are_named_when_none_is_left(site: Path, tiny_text: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UFORM_BLOCK_PLUGINS", "cpu,e4m3")
    message = "cannot place a model in RAM: no backend plugin of that kind is installed; blocked plugins (UFORM_BLOCK_PLUGINS or Host(blocked=...)): cpu, e4m3"
    with pytest.raises(uform.UnsupportedError, match=f"^{re.escape(message)}$"):
        uform.Model.load_ram(tiny_text)


def test_plugins_lists_backends_under_a_ceiling_that_names_no_class(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`uform plugins` stopped at 'backends:' with 'uform: error: UFORM_CPU_CLASS=...' (e4m3's detail raised)."""
    monkeypatch.setenv("UFORM_CPU_CLASS", "bogus")
    assert main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    e4m3 = next(x for x in lines if x.startswith("  e4m3 (ram): "))
    if get_host().probe(get_host().backends["e4m3"]) is None:  # the op library runs here: its detail is listed
        assert "available (loads fail: UFORM_CPU_CLASS='bogus' names no CPU class: set it to one of x86-64-v2" in e4m3
    assert "  cpu (ram): available" in lines


def test_the_names_a_verb_may_not_take_are_models_own() -> None:
    """core.plugin.MODEL_NAMES is every public name of Model but its verbs (a plugin verb named
    ``describe`` was listed in ``served.verbs`` and never reachable: ``model.describe`` is Model's)."""
    from uform.core.plugin import MODEL_NAMES
    from uform.verbs import CHOOSE_VERB, ENCODE_VERBS

    public = {n for n in dir(uform.Model) if not n.startswith("_")}
    assert MODEL_NAMES == public - set(ENCODE_VERBS.values()) - {CHOOSE_VERB}


def example_backend() -> str:
    """The third-party backend that docs/plugins.md shows, verbatim."""
    block = re.search(r"```python\n# uform_lean/plugin.py\n(.*?)```", DOCS.read_text(), re.S)
    assert block
    return block.group(1)


def test_third_party_backend_is_chosen_by_its_priority_and_accepts(
    site: Path, tiny_text: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/plugins.md had no backend example: how to bind the unbound weights (as what type) and
    what a Placement's bytes are was left to reading uform's own backends."""
    texts = ["a lean backend", "the same embeddings"]
    reference = uform.Model.load_ram(tiny_text, quantization=uform.Scalar.F32)
    assert reference.backend == "cpu"
    expected = np.array(reference.text_encode(texts, uform.Arena()).embeddings)
    install(site, "uform-lean", "lean = uform_lean.plugin", {"uform_lean/__init__.py": "", "uform_lean/plugin.py": example_backend()})
    reset_host()
    model = uform.Model.load_ram(tiny_text, quantization=uform.Scalar.F32)
    assert (model.backend, model.compute) == ("lean", "float32 products, one thread")
    assert model.describe().memory_usage == reference.describe().memory_usage
    np.testing.assert_allclose(np.array(model.text_encode(texts, uform.Arena()).embeddings), expected, atol=1e-6)
    assert uform.Model.load_ram(tiny_text).backend == "lean"  # bf16
    assert uform.Model.load_ram(tiny_text, quantization=uform.Scalar.E4M3).backend in ("e4m3", "cpu")
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "  lean (ram): available (ONNX Runtime's CPU execution provider, one thread)" in out.splitlines()
    assert re.search(r"^lean +uform-lean 0\.1 +backend +ok +lean$", out, re.M)
    monkeypatch.setenv("UFORM_BLOCK_PLUGINS", "lean")
    reset_host()
    assert uform.Model.load_ram(tiny_text).backend in ("e4m3", "cpu")


def test_a_detail_exiting_is_listed_not_the_end_of_uform_plugins(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A backend's detail calling sys.exit ended `uform plugins` half-way through its backends."""
    source = BACKEND + "def uform_backends():\n    import sys\n"
    source += "    yield Backend('boom', 'ram', lambda: None, lambda r: None, priority=50, detail=lambda: sys.exit('gone'))\n"
    install(site, "uform-broken", "boom = uform_broken", {"uform_broken/__init__.py": source})
    assert main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  boom (ram): available (its detail raised SystemExit: gone)" in lines
    assert "  cpu (ram): available" in lines
