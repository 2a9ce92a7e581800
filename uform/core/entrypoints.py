"""Loading one plugin's entry point, and running plugin code with its prints kept off stdout.

:func:`load` imports an entry point's module and then looks up the object it names, so that a
module that fails to import (``import failed: ModuleNotFoundError: ...``) is told apart from an
entry point naming an attribute its module lacks (the entry point's mistake, not the import's).
Both are :class:`~uform.core.wellformed.Refused` with the whole reason. :func:`unmet_requirement`
says why a plugin's distribution is not for the installed uform (its ``Requires-Dist`` on uform),
before anything of it is imported. :func:`slow` names a plugin that takes over
:data:`SLOW_SECONDS` to import and register: every process that loads a model pays that once.

:func:`to_stderr` runs plugin code (its import, its hooks, a backend's ``probe`` and
``accepts``: short calls, not ``open``, which runs for seconds while other threads may print) with ``sys.stdout`` pointed at ``sys.stderr``: what a plugin prints is still seen,
while uform's own output on stdout (``uform plugins --json``, ``uform describe --json``, a
table) stays whole. The redirection is process-wide while any such call lasts, in any thread.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata as metadata
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from .wellformed import ENTRY_POINT, Refused

__all__ = ["SLOW_SECONDS", "clock", "load", "slow", "to_stderr", "unmet_requirement"]

SLOW_SECONDS = 1.0  # a plugin taking longer to import and register is named in a warning
clock = time.perf_counter  # what :func:`slow` is measured with (a test's clock replaces it)


_redirect = threading.Lock()
_inside = 0  # calls of to_stderr under way, in every thread
_stdout: Any = None  # sys.stdout as the first of them found it


@contextlib.contextmanager
def to_stderr() -> Iterator[None]:
    """Inside, ``print()`` and ``sys.stdout`` write to ``sys.stderr``. Counted across threads:
    the first call in points stdout at stderr, the last out gives it back. (Each call saving and
    restoring its own, as ``contextlib.redirect_stdout`` does, left stdout on stderr for good
    when two threads' loads overlapped: the second saved the first's redirection and restored it
    last.)"""
    global _inside, _stdout
    with _redirect:
        if _inside == 0:
            _stdout, sys.stdout = sys.stdout, sys.stderr
        _inside += 1
    try:
        yield
    finally:
        with _redirect:
            _inside -= 1
            if _inside == 0:
                sys.stdout, _stdout = _stdout, None


def load(ep: metadata.EntryPoint, distribution: str) -> Any:
    """The object ``ep`` names (its module, or ``module:object``), imported with stdout on stderr;
    Refused naming why not: a value of another form, an import that failed (``SystemExit``
    included), or an object the imported module does not have."""
    if not ENTRY_POINT.fullmatch(ep.value):
        raise Refused(f"its entry point's value {ep.value!r} is not 'module' or 'module:object'")
    try:
        with to_stderr():
            obj = importlib.import_module(ep.module)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a broken plugin must not break the rest
        raise Refused(f"import failed: {type(exc).__name__}: {exc}") from exc
    path = ep.module
    for part in ep.attr.split(".") if ep.attr else ():
        try:
            with to_stderr():
                obj = getattr(obj, part)
        except AttributeError:
            raise Refused(
                f"its entry point {ep.name} = {ep.value.strip()} names {part!r}, which {path} does not have: "
                f"correct the entry point in {distribution}'s [project.entry-points.uform]"
            ) from None
        path = f"{path}.{part}"
    return obj


def unmet_requirement(dist: metadata.Distribution | None) -> str:
    """Why ``dist`` is not for the installed uform: a ``Requires-Dist`` on uform (its
    ``dependencies``) whose version range the installed one is outside ('' when none is)."""
    lines = [r for r in (dist.requires or []) if r.lstrip().lower().startswith("uform")] if dist is not None else []
    if not lines:
        return ""
    from packaging.requirements import InvalidRequirement, Requirement  # only for plugins that name uform
    from packaging.utils import canonicalize_name

    have = metadata.version("uform")
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue  # pip would not have installed it; its other checks still apply
        applies = req.marker is None or req.marker.evaluate({"extra": ""})
        if canonicalize_name(req.name) == "uform" and applies and not req.specifier.contains(have, prereleases=True):
            name = dist.metadata["Name"] if dist is not None else "it"
            return (
                f"it requires uform{req.specifier}, and the installed uform is {have}: install a release of "
                f"{name} made for uform {have}, or a uform in that range"
            )
    return ""


def slow(name: str, distribution: str, seconds: float) -> str:
    """The warning for plugin ``name`` taking ``seconds`` to import and register ('' under
    :data:`SLOW_SECONDS`)."""
    if seconds < SLOW_SECONDS:
        return ""
    return (
        f"uform plugin {name!r} from {distribution} took {seconds:.1f} s to import and register, which every "
        f"uform command and every process that loads a model pays: report it to {distribution.split()[0]}, "
        f"or set UFORM_BLOCK_PLUGINS={name} to go without it"
    )
