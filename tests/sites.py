"""Installing a plugin distribution as pip leaves it, into a folder on ``sys.path`` (tests import
this as ``from sites import install, site``; ``site`` is a fixture), and what the host logs."""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from uform.core.host import reset_host

PREFIXES = ("uform_smell", "uform_broken", "uform_rival", "uform_chatty", "uform_lean", "uform_slow")  # the modules the tests' distributions hold


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
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on ``sys.path`` to install into; the plugin host forgets its plugins before and after."""
    root = tmp_path / "site"
    root.mkdir()
    sys.path.insert(0, str(root))
    monkeypatch.delenv("UFORM_BLOCK_PLUGINS", raising=False)
    reset_host()
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.startswith(PREFIXES)]:
            del sys.modules[name]
        reset_host()


@contextlib.contextmanager
def logged(match: str = "") -> Iterator[list[str]]:
    """The warnings the logger ``uform.plugins`` gives inside (the host's one report of a skipped
    plugin), as ``pytest.warns`` takes a warning: one at least must match ``match``."""
    seen: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    log, catch = logging.getLogger("uform.plugins"), Catch(logging.WARNING)
    log.addHandler(catch)
    try:
        yield seen
    finally:
        log.removeHandler(catch)
    assert any(re.search(match, m) for m in seen), f"no warning matching {match!r} logged: {seen}"
