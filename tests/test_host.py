"""The plugin host's own calls: discovery run again, and a backend's accepts hook that fails."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import uform
from uform.core.host import Host, get_host, reset_host

from sites import install, site  # noqa: F401 - site is a fixture


def test_discover_twice_is_discover_once() -> None:
    """A second discover() registered every plugin again: each one 'is registered already' and
    failed (16 records, 8 of them failed, and a warning each)."""
    host = Host()
    host.discover()
    before = [(r.name, r.distribution, r.status, r.provides) for r in host.records]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        host.discover()
    assert [(r.name, r.distribution, r.status, r.provides) for r in host.records] == before
    assert all(r.status == "ok" for r in host.records)
    assert {"text", "cpu"} <= set(host.modalities) | set(host.backends)


def test_discover_again_takes_a_plugin_installed_since(site: Path) -> None:
    host = Host()
    host.discover()
    late = BACKEND + "def uform_backends():\n    yield Backend('late', 'ram', lambda: 'never here', lambda r: None)\n"
    install(site, "uform-broken", "late = uform_broken", {"uform_broken/__init__.py": late})
    host.discover()
    assert [(r.name, r.status, r.provides) for r in host.records if r.distribution == "uform-broken"] == [("late", "ok", ("late",))]
    assert not [r for r in host.records if r.status == "failed"]


def test_blocking_an_unknown_name_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    host = Host(blocked=["nosuch"])
    with caplog.at_level(logging.WARNING, logger="uform.plugins"):
        host.discover()
        assert [m for m in caplog.messages if "names 'nosuch'" in m] == [
            "UFORM_BLOCK_PLUGINS names 'nosuch', which no installed uform plugin is called; `uform plugins` lists their names"
        ]
        caplog.clear()
        host.discover()
    assert caplog.messages == []


BACKEND = "import uform\nfrom uform.core.plugin import Backend\n@uform.hookimpl\n"


@pytest.mark.parametrize(
    ("accepts", "reason"),
    [
        ("raise KeyError('quantization')", "its accepts raised KeyError: 'quantization'"),
        ("return True", "its accepts answered True, not None (accepted) or a reason (str)"),
        ("import sys; sys.exit(2)", "its accepts raised SystemExit: 2"),
    ],
    ids=["raises", "answers-bool", "exits"],
)
def test_a_broken_accepts_passes_its_backend_over(
    site: Path, tiny_text: Path, accepts: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An accepts hook that raised was a traceback of every load_ram (KeyError: 'quantization'),
    whichever backend would have taken the load; one answering True was a reason 'True'."""
    source = BACKEND + f"def uform_backends():\n    def accepts(request):\n        {accepts}\n    def place(r):\n        raise AssertionError('never opened')\n"
    source += "    yield Backend('boom', 'ram', lambda: None, place, priority=50, accepts=accepts)\n"
    install(site, "uform-broken", "boom = uform_broken", {"uform_broken/__init__.py": source})
    with caplog.at_level(logging.WARNING, logger="uform.plugins"):
        model = uform.Model.load_ram(tiny_text)
    assert model.backend in ("e4m3", "cpu")
    fix = "uform-broken 0.1 (plugin 'boom') has a bug: report it there, or block it with UFORM_BLOCK_PLUGINS=boom"
    assert f"backend 'boom': {reason}; {fix}" in caplog.messages
    assert get_host().records[[r.name for r in get_host().records].index("boom")].status == "ok"


def test_a_broken_accepts_is_named_when_no_backend_is_left(site: Path, tiny_text: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UFORM_BLOCK_PLUGINS", "cpu,e4m3")
    source = BACKEND + "def uform_backends():\n    def accepts(request):\n        raise ValueError('bad')\n"
    source += "    yield Backend('boom', 'ram', lambda: None, lambda r: None, accepts=accepts)\n"
    install(site, "uform-broken", "boom = uform_broken", {"uform_broken/__init__.py": source})
    with pytest.raises(uform.UnsupportedError, match=r"^cannot place a model in RAM: boom: its accepts raised ValueError: bad; uform-broken 0\.1 \(plugin 'boom'\) has a bug"):
        uform.Model.load_ram(tiny_text)


@pytest.mark.parametrize(
    ("answer", "wrong"),
    [
        ("{'text': None}", "dict, not a Placement"),
        ("Placement({}, 0, Scalar.F32)", "a Placement without a runner (an object with run) for the tower(s) 'text'"),
    ],
    ids=["a-dict", "no-runner"],
)
def test_an_open_answering_no_placement_is_named(site: Path, tiny_text: Path, answer: str, wrong: str) -> None:
    """A dict was 'TypeError: replace() should be called on dataclass instances' from dataclasses;
    a Placement without the tower's runner loaded, and every text_encode was a KeyError."""
    source = "import uform\nfrom uform.core.plugin import Backend, Placement\nfrom uform.core.types import Scalar\n@uform.hookimpl\n"
    source += f"def uform_backends():\n    yield Backend('weird', 'ram', lambda: None, lambda request: {answer}, priority=50)\n"
    install(site, "uform-broken", "weird = uform_broken", {"uform_broken/__init__.py": source})
    message = (
        f"backend 'weird': its open answered {wrong}; uform-broken 0.1 (plugin 'weird') has a bug: "
        "report it there, or block it with UFORM_BLOCK_PLUGINS=weird"
    )
    with pytest.raises(uform.PluginError, match=f"^{re.escape(message)}$"):
        uform.Model.load_ram(tiny_text)


ENTRY_SOURCE = textwrap.dedent(
    """
    import uform
    from uform.core.plugin import Backend

    class Plugin:
        @uform.hookimpl
        def uform_backends(self):
            yield Backend("weird", "ram", lambda: "never here", lambda r: None)

    plugin = Plugin()

    @uform.hookimpl
    def uform_backends():
        yield Backend("weird", "ram", lambda: "never here", lambda r: None)

    nothing = object()
    """
)


@pytest.mark.parametrize(
    ("value", "status", "error"),
    [
        ("uform_broken:plugin", "ok", ""),
        ("uform_broken", "ok", ""),
        ("", "failed", "its entry point's value '' is not 'module' or 'module:object'"),
        (
            "uform_broken:Plugin",
            "failed",
            "the entry point names the class Plugin, whose hooks would be called without an instance: "
            "name a module, or an instance of it (plugin = Plugin())",
        ),
        (
            "uform_broken:uform_backends",
            "failed",
            "the entry point names the hook function uform_backends itself: name the module (or object) that holds it",
        ),
        (
            "uform_broken:nothing",
            "failed",
            "'object' has no function marked @uform.hookimpl (uform's hooks are uform_backends, uform_modalities): "
            "the entry point names something that is not a uform plugin",
        ),
        (
            "uform_broken:plugn",
            "failed",
            "its entry point weird = uform_broken:plugn names 'plugn', which uform_broken does not have: "
            "correct the entry point in uform-broken's [project.entry-points.uform]",
        ),
        (
            "uform_broken:plugin.nosuch",
            "failed",
            "its entry point weird = uform_broken:plugin.nosuch names 'nosuch', which uform_broken.plugin does not have: "
            "correct the entry point in uform-broken's [project.entry-points.uform]",
        ),
    ],
    ids=["an-instance", "a-module", "empty", "a-class", "the-hook-itself", "no-hooks", "a-missing-object", "a-missing-member"],
)
def test_an_entry_point_naming_no_plugin_is_failed_by_name(site: Path, value: str, status: str, error: str) -> None:
    """An empty value failed with "AttributeError: 'NoneType' object has no attribute 'group'"; a
    class with "uform_backends names 'self', which the hook does not pass ... drop the argument";
    the hook function itself, or an object with no hooks, was listed 'ok' and provided nothing; an
    object the module lacks was "import failed: AttributeError: module 'uform_broken' has no
    attribute 'plugn'" (the module imported: the entry point is wrong)."""
    install(site, "uform-broken", f"weird = {value}", {"uform_broken/__init__.py": ENTRY_SOURCE})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        host = Host()
        host.discover()
    (record,) = [r for r in host.records if r.distribution == "uform-broken"]
    assert (record.status, record.error, record.provides) == (status, error, ("weird",) if status == "ok" else ())


SMELL_BROKEN = {
    "read": ("def read(cfg, model):\n", "    return cfg['nosuch']\n", "its read raised KeyError: 'nosuch'"),
    "tensors-list": ("def tensors(g, model):\n", "    return ['smell.embed.weight']\n", "its tensors answered list, not a mapping of tensor name to TensorSpec"),
    "tensors-shape": ("def tensors(g, model):\n", "    return {'smell.embed.weight': (16, g.width)}\n", "its tensors answered tuple for 'smell.embed.weight', not a TensorSpec"),
    "graph": ("def graph(g, model, b):\n", "    raise ZeroDivisionError('oops')\n", "its graph raised ZeroDivisionError: oops"),
    "read-exits": ("def read(cfg, model):\n", "    import sys; sys.exit('unsupported')\n", "its read raised SystemExit: unsupported"),
}


def smelly_checkpoint(site: Path, path: Path) -> str:
    """docs/plugins.md's smell plugin installed into ``site`` and a checkpoint of text and smell
    saved at ``path``; the plugin's source, for a test to break."""
    from test_plugins import example_plugin

    from uform.core import checkpoint

    good = example_plugin()
    install(site, "uform-smell", "smell = uform_smell", {"uform_smell/__init__.py": good})
    config, tensors = checkpoint.new(get_host(), "tiny", 0, ["text", "smell"])
    checkpoint.save(path, config, tensors)
    return good


def replace_smell(site: Path, source: str) -> None:
    """The installed smell plugin's source replaced by ``source``, found again by the next load."""
    (site / "uform_smell" / "__init__.py").write_text(source)
    for name in [m for m in sys.modules if m.startswith("uform_smell")]:
        del sys.modules[name]
    reset_host()


@pytest.mark.parametrize("broken", list(SMELL_BROKEN))
def test_a_tower_function_failing_is_the_plugins_error_named(site: Path, tmp_path: Path, broken: str) -> None:
    """docs/plugins.md's smell plugin with one function broken: each was a bare traceback of the load
    (KeyError: 'nosuch'; ValueError: dictionary update sequence element #0 has length 18; 2 is
    required; AttributeError: 'tuple' object has no attribute 'shape'; ZeroDivisionError: oops);
    a read calling sys.exit ended the program."""
    good = smelly_checkpoint(site, tmp_path / "smelly.safetensors")
    where, body, reason = SMELL_BROKEN[broken]
    replace_smell(site, good.replace(where, where + body))
    fix = "uform-smell 0.1 (plugin 'smell') has a bug: report it there, or block it with UFORM_BLOCK_PLUGINS=smell"
    message = f"tower 'smell': {reason}; {fix}"
    with pytest.raises(uform.PluginError, match=f"^{re.escape(message)}$"):
        uform.Model.load_ram(tmp_path / "smelly.safetensors")


SMELL_DESCRIBE = {
    "raises": ("    raise KeyError('width')\n", "its describe raised KeyError: 'width'"),
    "list": ("    return [('token_width', 4)]\n", "its describe answered list, not a mapping of description field to int"),
    "str": ("    return {'token_width': 'wide'}\n", "its describe answered 'wide' for 'token_width', not an int (0 or more)"),
    "field": ("    return {'token_widht': 4}\n", "its describe answered the field 'token_widht', not one of token_width, choice_temperature_groups"),
}


@pytest.mark.parametrize("broken", list(SMELL_DESCRIBE))
def test_a_modality_describe_failing_is_the_plugins_error_named(site: Path, tmp_path: Path, broken: str) -> None:
    """docs/plugins.md's smell plugin given a describe that raises or answers wrong: model.describe()
    (and `uform describe`) was a bare traceback (KeyError: 'width'; TypeError: cannot convert
    dictionary update sequence element #0 to a sequence), or a misspelled field silently dropped."""
    good = smelly_checkpoint(site, tmp_path / "smelly.safetensors")
    body, reason = SMELL_DESCRIBE[broken]
    source = good.replace('{"smell_encode": smell_encode})', '{"smell_encode": smell_encode}, describe)')
    source = source.replace("def graph(", f"def describe(g, model):\n{body}\n\ndef graph(")
    assert source.count("describe") == 2
    replace_smell(site, source)
    fix = "uform-smell 0.1 (plugin 'smell') has a bug: report it there, or block it with UFORM_BLOCK_PLUGINS=smell"
    message = f"modality 'smell': {reason}; {fix}"
    with uform.Model.load_ram(tmp_path / "smelly.safetensors") as model:
        with pytest.raises(uform.PluginError, match=f"^{re.escape(message)}$"):
            model.describe()


def test_an_attribute_error_importing_the_module_is_an_import_failure(site: Path) -> None:
    """An entry point naming an object the module lacks is the entry point's mistake; an
    AttributeError raised while the module imports stays the import's."""
    install(site, "uform-broken", "weird = uform_broken:plugin", {"uform_broken/__init__.py": "import os\nos.nosuch\n"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        host = Host()
        host.discover()
    (record,) = [r for r in host.records if r.distribution == "uform-broken"]
    assert record.error == "import failed: AttributeError: module 'os' has no attribute 'nosuch'"


CHATTY = textwrap.dedent(
    """
    import uform
    from uform.core.plugin import Backend
    from uform.plugins import cpu
    print("chatty: imported")

    def place(request):
        return cpu.open_ram(request)

    @uform.hookimpl
    def uform_backends():
        print("chatty: uform_backends")
        yield Backend("chatty", "ram", lambda: print("chatty: probe"), place, priority=50, accepts=lambda r: print("chatty: accepts"))
    """
)


def test_what_a_plugin_prints_goes_to_stderr_not_into_uforms_output(site: Path, tiny_text: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A plugin printing at import, in its hook, probe or accepts wrote into stdout, so
    ``uform plugins --json`` and ``uform describe --json`` printed 'chatty: imported' before the
    JSON (json.loads: 'Expecting value: line 1 column 1'). It is on stderr now, the JSON whole."""
    from uform.cli import main

    install(site, "uform-chatty", "chatty = uform_chatty", {"uform_chatty/__init__.py": CHATTY})
    assert main(["plugins", "--json"]) == 0
    out, err = capsys.readouterr()
    assert [r["status"] for r in json.loads(out) if r["name"] == "chatty"] == ["ok"]
    assert err.splitlines() == ["chatty: imported", "chatty: uform_backends"]
    assert main(["describe", "--json", "-m", str(tiny_text)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["backend"] == "chatty"
    assert err.splitlines() == ["chatty: probe", "chatty: accepts"]


def test_a_write_to_descriptor_1_is_not_switched_as_the_docs_say(site: Path) -> None:
    """docs/plugins.md: the switch is Python's sys.stdout alone; a plugin's os.write(1, ...) lands
    in uform's output (switching the descriptor would send other threads' output to stderr:
    benchmarks/stdout_switch.py). What a plugin prints goes to stderr, its raw write to stdout."""
    source = "import os\nprint('printed')\nos.write(1, b'raw\\n')\n" + CHATTY
    install(site, "uform-chatty", "chatty = uform_chatty", {"uform_chatty/__init__.py": source})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    done = subprocess.run([sys.executable, "-m", "uform.cli", "plugins", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("raw\n[") and "printed" not in done.stdout, done.stdout[:200]
    assert [r["status"] for r in json.loads(done.stdout[len("raw\n") :]) if r["name"] == "chatty"] == ["ok"]
    assert done.stderr.splitlines()[:2] == ["printed", "chatty: imported"], done.stderr


@pytest.mark.parametrize(
    ("requires", "error"),
    [
        ("uform>=9", "it requires uform>=9, and the installed uform is {have}: install a release of uform-broken made for uform {have}, or a uform in that range"),
        ("uform (<4.0.0rc1)", "it requires uform<4.0.0rc1, and the installed uform is {have}: install a release of uform-broken made for uform {have}, or a uform in that range"),
        ("uform>=3.9", ""),
        ("uform>=9; extra == 'gpu'", ""),
        ("uform-smell>=9", ""),
    ],
    ids=["newer", "older", "met", "an-extra's", "another-distribution"],
)
def test_a_plugin_made_for_another_uform_is_not_imported(site: Path, requires: str, error: str) -> None:
    """A distribution declaring dependencies = ["uform>=9"] (installed with --no-deps; `pip check`
    said 'uform-broken 0.3 has requirement uform>=9, but you have uform 4.0.0rc1') was imported
    and listed 'ok', whatever of uform 9 it relies on."""
    install(site, "uform-broken", "weird = uform_broken", {"uform_broken/__init__.py": ENTRY_SOURCE})
    with open(site / "uform_broken-0.1.dist-info" / "METADATA", "a") as f:
        f.write(f"Requires-Dist: {requires}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        host = Host()
        host.discover()
    (record,) = [r for r in host.records if r.distribution == "uform-broken"]
    have = metadata.version("uform")
    assert (record.status, record.error) == ("failed" if error else "ok", error.format(have=have))
    assert ("uform_broken" in sys.modules) == (not error)


def test_stdout_comes_back_when_two_threads_run_plugin_code_at_once() -> None:
    """Two threads in plugin code at once (two loads asking a backend's ``accepts``): the first
    in, the first out. Each saving and restoring its own stdout (``contextlib.redirect_stdout``)
    left the second's saved value, stderr, as stdout for good: every later print went to stderr."""
    import threading

    from uform.core.entrypoints import to_stderr

    before = sys.stdout
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with to_stderr():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second() -> None:
        first_in.wait(10)
        with to_stderr():
            assert sys.stdout is sys.stderr
            second_in.set()
            first_out.wait(10)
            assert sys.stdout is sys.stderr  # the first leaving does not end the second's redirection

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sys.stdout is before


def test_a_skipped_plugins_warning_says_how_to_go_without_it(site: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The warning every uform command printed for a plugin that fails to import named the plugin
    and the culprit but not what to do; it ends with how to be rid of it (and of the warning)."""
    install(site, "uform-broken", "weird = uform_broken", {"uform_broken/__init__.py": "import nosuch_dependency_xyz\n"})
    with caplog.at_level(logging.WARNING, logger="uform.plugins"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Host().discover()
    message = (
        "uform plugin 'weird' from uform-broken 0.1 is unusable and was skipped: import failed: ModuleNotFoundError: "
        "No module named 'nosuch_dependency_xyz' (to go without it and this warning, uninstall uform-broken or set "
        "UFORM_BLOCK_PLUGINS=weird)"
    )
    assert caplog.messages == [message]
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []  # told once, in the log


def test_a_skipped_plugin_is_one_line_on_stderr(site: Path) -> None:
    """Each skipped plugin was told three times on stderr: the log's line, then a RuntimeWarning's
    two ('.../uform/core/host.py:328: RuntimeWarning: uform plugin ...' and its source line,
    '  host.discover()'), for one cause. `uform plugins` and any load now print the log's line alone."""
    install(site, "uform-broken", "weird = uform_broken", {"uform_broken/__init__.py": "raise ImportError('no GPU driver')\n"})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    env.pop("PYTHONWARNINGS", None)
    message = ("uform plugin 'weird' from uform-broken 0.1 is unusable and was skipped: import failed: ImportError: no GPU driver "
               "(to go without it and this warning, uninstall uform-broken or set UFORM_BLOCK_PLUGINS=weird)\n")  # fmt: skip
    for command in (["-m", "uform.cli", "plugins"], ["-c", "from uform.core.host import get_host; get_host()"]):
        done = subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env, timeout=120)
        assert (done.returncode, done.stderr) == (0, message), done.stderr


SNIFF = textwrap.dedent(
    """
    import uform
    from uform.core.plugin import Modality, Tower

    VERBS = {"sniff": lambda call: "sniffed"}
    PRESETS = {"tiny": {"width": 8}}

    @uform.hookimpl
    def uform_modalities():
        yield Modality("sniff", Tower("sniffer", lambda c, m: c, lambda p, m: {}, lambda p, m, b: None, PRESETS), VERBS)
    """
)


def test_a_plugin_changing_what_it_yielded_changes_nothing_uform_uses(site: Path) -> None:
    """A modality's verbs (and its tower's presets) were the plugin's own dict, checked once: a
    plugin adding to it after registration gained a verb named 'describe', which the checks
    refuse, and took the built-in 'text_encode' from the text plugin, with no conflict."""
    install(site, "uform-broken", "sniff = uform_broken", {"uform_broken/__init__.py": SNIFF})
    host = Host()
    host.discover()
    import uform_broken  # type: ignore[import-not-found]

    uform_broken.VERBS.update(describe=lambda call: "hijacked", text_encode=lambda call: "hijacked")
    uform_broken.PRESETS["small"] = {"width": 16}
    assert host.verb("text_encode").name == "text"
    with pytest.raises(uform.UnsupportedError, match="^no installed plugin provides describe;"):
        host.verb("describe")
    assert list(host.modalities["sniff"].verbs) == ["sniff"]
    assert list(host.modalities["sniff"].tower.presets) == ["tiny"]


def test_a_plugin_slow_to_import_is_named(site: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A plugin taking seconds to import (a time.sleep(3) at import: uform plugins took 4.5 s
    instead of 1.0) made every command slower with nothing naming it. Its import is timed on a
    clock the test's plugin moves by 5 s; a quick plugin is not named."""
    from uform.core import entrypoints

    now = [0.0]
    monkeypatch.setattr(entrypoints, "clock", lambda: now[0])
    monkeypatch.setattr(sys.modules[__name__], "NOW", now, raising=False)
    slow = f"import sys\nsys.modules[{__name__!r}].NOW[0] += 5\n" + ENTRY_SOURCE.replace('"weird"', '"slow"')
    install(site, "uform-slow", "slow = uform_slow:plugin", {"uform_slow/__init__.py": slow})
    install(site, "uform-broken", "weird = uform_broken:plugin", {"uform_broken/__init__.py": ENTRY_SOURCE})
    with caplog.at_level(logging.WARNING, logger="uform.plugins"):
        host = Host()
        host.discover()
    assert {r.name: r.status for r in host.records}["slow"] == "ok"
    assert caplog.messages == [
        "uform plugin 'slow' from uform-slow 0.1 took 5.0 s to import and register, which every uform command and "
        "every process that loads a model pays: report it to uform-slow, or set UFORM_BLOCK_PLUGINS=slow to go without it"
    ]


def test_a_conflict_with_a_built_in_is_logged_once(site: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A plugin yielding a backend named 'cpu' took every RAM load down (PluginConflictError)
    while uform logged nothing: only `uform plugins` or a failing load told of it."""
    install(site, "uform-broken", "weird = uform_broken", {"uform_broken/__init__.py": BACKEND + "def uform_backends():\n    yield Backend('cpu', 'ram', lambda: None, lambda r: None)\n"})
    with caplog.at_level(logging.WARNING, logger="uform.plugins"):
        host = Host()
        host.discover()
        host.discover()
    assert caplog.messages == [
        f"uform {metadata.version('uform')} (plugin 'cpu') and uform-broken 0.1 (plugin 'weird') both claim the backend 'cpu'; neither claim "
        "is used. Uninstall one, or block one with UFORM_BLOCK_PLUGINS=cpu or UFORM_BLOCK_PLUGINS=weird"
    ]


@pytest.mark.parametrize(
    ("where", "error"),
    [
        ("import", "import failed: PluginError: "),
        ("hook", "uform_backends raised PluginError: "),
    ],
)
def test_a_plugin_asking_for_the_host_while_it_loads_fails_instead_of_hanging(site: Path, where: str, error: str) -> None:
    """A plugin calling get_host() (or loading a model) at import or in its hook hung the process
    for good: get_host held its lock while it discovered, and waited on it again. Run in a child
    process, so that the old hang fails the test by its timeout and no lock is left held here."""
    ask = "from uform.core.host import get_host\nget_host()\n"
    source = (ask if where == "import" else "") + BACKEND + "def uform_backends():\n"
    source += textwrap.indent(ask, "    ") + "    yield Backend('weird', 'ram', lambda: 'never here', lambda r: None)\n"
    install(site, "uform-broken", "weird = uform_broken", {"uform_broken/__init__.py": source})
    code = "from uform.core.host import get_host\nprint([r.error for r in get_host().records if r.name == 'weird'][0])"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True).stdout
    assert out.strip() == error + (
        "a plugin asked for uform's plugin host (get_host(), or a model loaded) while the host was loading it: "
        "a plugin's import and hooks run before the host is ready; ask in a verb, a tower's function or a backend's open"
    )


@pytest.mark.parametrize("hook", ["uform_backends", "uform_modalities"])
def test_a_hook_that_yields_forever_is_refused_not_a_hang(site: Path, hook: str) -> None:
    """A generator hook that never ends hung `uform plugins` and every load (and grew a list for
    as long as it ran: here a record a millisecond, so the old code meets the child's timeout
    before it fills memory). Now a hook yielding more than MAX_RECORDS (1,000) is refused: its
    plugin skipped, the hook named, the others working."""
    record = "Backend('loop', 'ram', lambda: 'never here', lambda r: None)" if hook == "uform_backends" else "None"
    source = BACKEND + f"def {hook}():\n    import time\n    while True:\n        time.sleep(0.001)\n        yield {record}\n"
    install(site, "uform-broken", "loop = uform_broken", {"uform_broken/__init__.py": source})
    code = "from uform.core.host import get_host\nh = get_host()\nprint([r.error for r in h.records if r.name == 'loop'][0])\nprint(sorted(h.backends))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    error = f"{hook} yielded more than 1000 records (a generator that does not end?); a hook yields its few records and returns"
    assert done.stdout.splitlines()[0] == error and "'cpu'" in done.stdout.splitlines()[1], done.stderr
    assert f"uform plugin 'loop' from uform-broken 0.1 is unusable and was skipped: {error}" in done.stderr
