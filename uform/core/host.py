"""The plugin host: finds plugins through the ``uform`` entry-point group and collects their records.

Built-in plugins are found exactly like third-party ones. Every hook is called through
pluggy's plugin manager, one plugin at a time, so that what a plugin yields is attributed
to it and a failure stays its own. A plugin that fails to import, implements a hook uform
does not have, names a hook argument the spec lacks, leaves a hook function unmarked, or
whose hook raises, yields the wrong records or more than :data:`MAX_RECORDS` is reported (a warning of the logger
``uform.plugins``, once, and ``uform plugins`` lists it as failed with the reason) and the
others keep working.

Two plugins claiming one modality, tower, verb or backend name are a recorded
:class:`Conflict`: neither claim is used, ``uform plugins`` shows both plugins, and only a
load that needs the contested name raises :class:`~uform.PluginConflictError` naming them.
Plugins named in ``UFORM_BLOCK_PLUGINS`` (comma-separated entry-point names) or in
``Host(blocked=...)`` are not loaded at all.

This module holds :class:`Host` (discovery, registration, the lookups, and the guarded calls into
backends and towers), :func:`get_host` and :func:`reset_host`. What a plugin hands uform is
checked in :mod:`uform.core.wellformed`; the records and who gets each contested name are
:mod:`uform.core.claims` (``PluginRecord``, ``Claimant``, ``Conflict`` and ``BLOCK_ENV`` are
importable from here too).
"""

from __future__ import annotations

import importlib.metadata as metadata
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pluggy

from . import entrypoints, hookspecs
from .claims import BLOCK_ENV, Claimant, Conflict, Loaded, PluginRecord, Resolution, resolve
from .entrypoints import load, to_stderr, unmet_requirement
from .errors import PluginConflictError, PluginError, UformError, UnsupportedError
from .plugin import Backend, LoadRequest, Modality, Placement
from .wellformed import Refused, check_records, check_registered, check_unregistered, held, shown, wrong_described, wrong_specs

__all__ = ["BLOCK_ENV", "MAX_RECORDS", "Claimant", "Conflict", "Host", "PluginRecord", "blocked_from_env", "get_host", "reset_host"]

log = logging.getLogger("uform.plugins")
MAX_RECORDS = 1000  # a hook yielding more is refused: what it yields is read whole, before anything else runs


def blocked_from_env(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The plugin names ``UFORM_BLOCK_PLUGINS`` lists (comma-separated, blanks ignored)."""
    value = (os.environ if environ is None else environ).get(BLOCK_ENV, "")
    return frozenset(n.strip() for n in value.split(",") if n.strip())


class Host:
    """The loaded plugins: modalities by name and by tower, verbs, and backends."""

    def __init__(self, blocked: Iterable[str] = ()) -> None:
        self.manager = pluggy.PluginManager(hookspecs.PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.blocked = frozenset(blocked)
        for name in self.blocked:
            self.manager.set_blocked(name)
        self.records: list[PluginRecord] = []
        self.modalities: dict[str, Modality] = {}
        self.backends: dict[str, Backend] = {}
        self.conflicts: list[Conflict] = []
        self._entries: list[PluginRecord | Loaded] = []  # in discovery order
        self._used = Resolution()  # what is used of them, what is withheld, whose each name is
        self._groups: set[str] = set()  # the entry-point groups discover() has read
        self._discovered: set[tuple[str, str, str, str]] = set()  # (group, name, value, distribution) taken
        self._told: set[str] = set()  # the conflicts logged

    # -- discovery -----------------------------------------------------------------------

    def discover(self, group: str = hookspecs.PROJECT) -> None:
        """Load every entry point of ``group``; record failures instead of raising them. Called
        again, it loads only the entry points it has not seen (one installed since): a plugin
        is loaded once, and an unknown blocked name is warned of once."""
        seen = set()
        again = group in self._groups
        self._groups.add(group)
        for ep in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
            dist = ep.dist.name if ep.dist else "<unknown>"
            version = ep.dist.version if ep.dist else ""
            seen.add(ep.name)
            if (group, ep.name, ep.value, dist) in self._discovered:
                continue
            self._discovered.add((group, ep.name, ep.value, dist))
            if ep.name in self.blocked:
                self._record(PluginRecord(ep.name, dist, version, "", "blocked", (), f"blocked by {BLOCK_ENV} or Host(blocked=...)"))
                continue
            unmet = unmet_requirement(ep.dist)  # a plugin made for another uform is not imported
            if unmet:
                self._failed(ep.name, dist, version, unmet)
                continue
            started = entrypoints.clock()
            try:
                plugin = load(ep, dist)
            except Refused as exc:  # a broken plugin must not break the rest
                self._failed(ep.name, dist, version, str(exc))
                continue
            self.add(plugin, ep.name, dist, version)
            slow = entrypoints.slow(ep.name, f"{dist} {version}", entrypoints.clock() - started)
            if slow:
                log.warning(slow)
        for conflict in self.conflicts:  # each logged once, as it stands once every plugin is in
            if conflict.message() not in self._told:
                self._told.add(conflict.message())
                log.warning(conflict.message())
        unknown = sorted(self.blocked - seen)
        if unknown and not again:
            log.warning(f"{BLOCK_ENV} names {', '.join(map(repr, unknown))}, which no installed uform plugin is called; `uform plugins` lists their names")

    def add(self, plugin: Any, name: str, distribution: str = "<local>", version: str = "") -> None:
        """Register one plugin object or module and collect what its hooks yield."""
        if name in self.blocked:
            self._record(PluginRecord(name, distribution, version, "", "blocked", (), f"blocked by {BLOCK_ENV} or Host(blocked=...)"))
            return
        registered = False
        try:
            check_unregistered(self.manager, plugin)
            self.manager.register(plugin, name=self._unused_name(name, distribution))
            registered = True
            check_registered(self.manager, plugin)
            modalities = self._hook(plugin, "uform_modalities")
            backends = self._hook(plugin, "uform_backends")
            check_records("uform_modalities", modalities, Modality)
            check_records("uform_backends", backends, Backend)
            modalities = [held(m) for m in modalities]  # what was checked is what is used
        except (Exception, SystemExit) as exc:  # noqa: BLE001
            if registered:
                self.manager.unregister(plugin)
            refused = isinstance(exc, (Refused, pluggy.PluginValidationError))
            reason = " ".join(str(exc).split()) if refused else f"{type(exc).__name__}: {exc}"
            self._failed(name, distribution, version, reason)
            return
        self._entries.append(Loaded(Claimant(name, distribution, version), tuple(modalities), tuple(backends)))
        self._resolve()

    def _unused_name(self, name: str, distribution: str) -> str:
        """``name``, or where another distribution's entry point of that name is registered
        already, ``name`` qualified by ``distribution`` (pluggy names a plugin once)."""
        unused, n = name, 1
        while self.manager.has_plugin(unused):
            unused, n = f"{name} ({distribution}{'' if n == 1 else f' {n}'})", n + 1
        return unused

    def _hook(self, plugin: Any, hook: str) -> list[Any]:
        """What ``plugin``'s implementation of ``hook`` yields, called through the manager;
        Refused naming the hook when it raises or answers something that is not iterable."""
        others = [p for p in self.manager.get_plugins() if p is not plugin]
        caller = self.manager.subset_hook_caller(hook, remove_plugins=others)
        try:
            items: list[Any] = []
            with to_stderr():  # what it prints (calling it, iterating what it yields) stays off stdout
                for result in caller():
                    if result is not None and not isinstance(result, Iterable):
                        raise Refused(f"{hook} returned {type(result).__name__}, not an iterable of records")
                    items += itertools.islice(result or (), MAX_RECORDS + 1 - len(items))  # a generator that never ends, ended
                    if len(items) > MAX_RECORDS:
                        raise Refused(f"{hook} yielded more than {MAX_RECORDS} records (a generator that does not end?); a hook yields "
                                      "its few records and returns")  # fmt: skip
            return items
        except Refused:
            raise
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the plugin's failure, named
            raise Refused(f"{hook} raised {type(exc).__name__}: {exc}") from exc

    def _resolve(self) -> None:
        """Rebuild what is used from every loaded plugin: contested names go to no one."""
        self._used = resolve(self._entries)
        self.records, self.modalities, self.backends, self.conflicts = (
            self._used.records, self._used.modalities, self._used.backends, self._used.conflicts
        )

    def _record(self, record: PluginRecord) -> None:
        self._entries.append(record)
        self.records.append(record)

    def _failed(self, name: str, distribution: str, version: str, error: str) -> None:
        remove = "" if distribution == "uform" else f"uninstall {distribution} or "
        msg = (
            f"uform plugin {name!r} from {distribution} {version} is unusable and was skipped: {error} "
            f"(to go without it and this warning, {remove}set {BLOCK_ENV}={name})"
        )
        log.warning(msg)  # once, in the log alone: a RuntimeWarning beside it was two more lines on stderr for one cause
        self._record(PluginRecord(name, distribution, version, "", "failed", (), error))

    # -- lookups -------------------------------------------------------------------------

    def tower_owner(self, tower: str) -> Modality | None:
        """The modality running ``tower``; PluginConflictError when plugins contest it."""
        for m, conflict in self._used.withheld_modalities:
            if m.tower.name == tower:
                raise PluginConflictError(f"tower {tower!r}: {conflict.message()}")
        return next((m for m in self.modalities.values() if m.tower.name == tower), None)

    def verb(self, name: str) -> Modality:
        """The modality providing verb ``name``; PluginConflictError when plugins contest it,
        UnsupportedError when no installed plugin provides it."""
        conflict = self._used.withheld.get(("verb", name))
        if conflict is not None:
            raise PluginConflictError(f"verb {name!r}: {conflict.message()}")
        for m in self.modalities.values():
            if name in m.verbs:
                return m
        raise UnsupportedError(f"no installed plugin provides {name}; `uform plugins` lists what is installed")

    def backends_for(self, placement: str) -> list[Backend]:
        """Backends of ``placement``, best first; PluginConflictError when one of them is contested."""
        for b, conflict in self._used.withheld_backends:
            if b.placement == placement:
                raise PluginConflictError(f"placing in {placement.upper()}: {conflict.message()}")
        found = [b for b in self.backends.values() if b.placement == placement]
        return sorted(found, key=lambda b: -b.priority)

    def probe(self, backend: Backend) -> str | None:
        """``backend.probe()``: None when it can run here, else why not. A probe that raises,
        or answers something other than None or a reason (a str), is a reason too, naming its
        plugin: a broken backend is passed over, never fatal to a load or `uform plugins`."""
        return self._asked(backend, "probe", backend.probe)

    def accepts(self, backend: Backend, request: LoadRequest) -> str | None:
        """``backend.accepts(request)``: None when it serves this load, else why not; one that
        raises or answers something other than None or a str is a reason naming its plugin (and
        a warning in the log), so that the load goes on to the next backend as after a probe's."""
        return self._asked(backend, "accepts", lambda: backend.accepts(request))

    def open(self, backend: Backend, request: LoadRequest) -> Placement:
        """``backend.open(request)``, what it raises raised; PluginError naming its plugin when it
        answers something other than a Placement with a runner (an object with ``run``) for
        every tower of the request."""
        placement = backend.open(request)  # not to_stderr: it runs for seconds while other threads may print
        if not isinstance(placement, Placement):
            wrong = f"{shown(placement)}, not a Placement"
        else:
            runners = placement.runners if isinstance(placement.runners, Mapping) else {}
            lacking = [t for t in request.towers if not callable(getattr(runners.get(t), "run", None))]
            wrong = f"a Placement without a runner (an object with run) for the tower(s) {', '.join(map(repr, lacking))}" if lacking else ""
        if wrong:
            raise PluginError(f"backend {backend.name!r}: its open answered {wrong}; {self._fix(backend)}")
        return placement

    def _fix(self, backend: Backend) -> str:
        return _fix(self._used.backend_owners.get(backend.name))

    def tower_call(self, modality: Modality, what: str, *args: Any) -> Any:
        """``modality.tower.<what>(*args)`` (``read``, ``tensors``, ``graph``): uform's own errors (a
        CheckpointError naming a field) as raised; any other exception, and ``tensors`` answering
        something other than a mapping of tensor name to TensorSpec, PluginError naming the plugin."""
        who = f"tower {modality.tower.name!r}"
        answer = self._plugin_call(modality, who, what, getattr(modality.tower, what), args)
        wrong = wrong_specs(answer) if what == "tensors" else ""
        if wrong:
            raise PluginError(f"{who}: its tensors answered {wrong}; {self._owner_fix(modality)}")
        return dict(answer) if what == "tensors" else answer

    def described(self, modality: Modality, parsed: Any, config: Any) -> dict[str, int]:
        """``modality.describe(parsed, config)`` (``{}`` when it has none), checked as
        :meth:`tower_call` checks a tower's answers: PluginError naming the plugin when it raises
        or answers other than a mapping of ModelDescription fields (``token_width``,
        ``choice_temperature_groups``) to ints."""
        if modality.describe is None:
            return {}
        who = f"modality {modality.name!r}"
        answer = self._plugin_call(modality, who, "describe", modality.describe, (parsed, config))
        wrong = wrong_described(answer)
        if wrong:
            raise PluginError(f"{who}: its describe answered {wrong}; {self._owner_fix(modality)}")
        return dict(answer)

    def _plugin_call(self, modality: Modality, who: str, what: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        try:
            return fn(*args)
        except UformError:
            raise
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the plugin's bug (sys.exit too), named
            raise PluginError(f"{who}: its {what} raised {type(exc).__name__}: {exc}; {self._owner_fix(modality)}") from exc

    def _owner_fix(self, modality: Modality) -> str:
        return _fix(self._used.modality_owners.get(modality.name))

    def _asked(self, backend: Backend, what: str, ask: Callable[[], Any]) -> str | None:
        fix = self._fix(backend)
        try:
            with to_stderr():
                reason = ask()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the plugin's failure (sys.exit too), named
            wrong = f"its {what} raised {type(exc).__name__}: {exc}; {fix}"
        else:
            if reason is None or isinstance(reason, str):
                return reason
            wrong = f"its {what} answered {shown(reason)}, not None ({'available' if what == 'probe' else 'accepted'}) or a reason (str); {fix}"
        if what != "probe":  # a probe is asked by `uform plugins` too: its reason is listed there
            log.warning("backend %r: %s", backend.name, wrong)
        return wrong

    def no_backend(self, placement: str) -> str:
        """Why no backend of ``placement`` is there: none is installed, or the blocked plugins."""
        blocked = [r.name for r in self.records if r.status == "blocked"]
        also = f"; blocked plugins ({BLOCK_ENV} or Host(blocked=...)): {', '.join(blocked)}" if blocked else ""
        return f"no backend plugin of that kind is installed{also}"


def _fix(who: Claimant | None) -> str:
    return f"{who} has a bug: report it there, or block it with {BLOCK_ENV}={who.plugin}" if who else "a bug of its plugin"


_host: Host | None = None
_lock = threading.Lock()
_discovering: int | None = None  # the thread discovering the process-wide host's plugins


def get_host() -> Host:
    """The process-wide host, discovering plugins on first use (``UFORM_BLOCK_PLUGINS`` is read then).
    PluginError when a plugin asks for it while it discovers (at import, or in a hook): the host
    is not ready until every plugin is in, and waiting for itself would hang."""
    global _host, _discovering
    if _discovering == threading.get_ident():
        raise PluginError(
            "a plugin asked for uform's plugin host (get_host(), or a model loaded) while the host was loading it: "
            "a plugin's import and hooks run before the host is ready; ask in a verb, a tower's function or a backend's open"
        )
    with _lock:
        if _host is None:
            _discovering = threading.get_ident()
            try:
                host = Host(blocked_from_env())
                host.discover()
            finally:
                _discovering = None
            _host = host
        return _host


def reset_host() -> None:
    """Forget the discovered plugins; the next :func:`get_host` discovers again."""
    global _host
    with _lock:
        _host = None
