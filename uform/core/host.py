"""The plugin host: finds plugins through the ``uform`` entry-point group and collects their records.

Built-in plugins are found exactly like third-party ones. Every hook is called through
pluggy's plugin manager, one plugin at a time, so that what a plugin yields is attributed
to it and a failure stays its own. A plugin that fails to import, implements a hook uform
does not have, names a hook argument the spec lacks, leaves a hook function unmarked, or
whose hook raises or yields the wrong records is reported (a warning, and ``uform plugins``
lists it as failed with the reason) and the others keep working.

Two plugins claiming one modality, tower, verb or backend name are a recorded
:class:`Conflict`: neither claim is used, ``uform plugins`` shows both plugins, and only a
load that needs the contested name raises :class:`~uform.PluginConflictError` naming them.
Plugins named in ``UFORM_BLOCK_PLUGINS`` (comma-separated entry-point names) or in
``Host(blocked=...)`` are not loaded at all.
"""

from __future__ import annotations

import difflib
import inspect
import importlib.metadata as metadata
import logging
import os
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy

from . import hookspecs
from .errors import PluginConflictError, UnsupportedError
from .plugin import Backend, Modality

log = logging.getLogger("uform.plugins")

BLOCK_ENV = "UFORM_BLOCK_PLUGINS"


def blocked_from_env(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The plugin names ``UFORM_BLOCK_PLUGINS`` lists (comma-separated, blanks ignored)."""
    value = (os.environ if environ is None else environ).get(BLOCK_ENV, "")
    return frozenset(n.strip() for n in value.split(",") if n.strip())


@dataclass(frozen=True)
class PluginRecord:
    """One plugin as ``uform plugins`` shows it.

    ``status`` is ``"ok"``, ``"failed"`` (nothing of it is used; ``error`` says why),
    ``"conflict"`` (some of its names are also claimed by another plugin: those are not
    used, the rest are; ``error`` names the other plugin) or ``"blocked"``.
    """

    name: str
    distribution: str
    version: str
    kind: str  # "modality", "backend", "modality+backend", or "" when it provides nothing
    status: str
    provides: tuple[str, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class Claimant:
    """A plugin as a conflict names it."""

    plugin: str
    distribution: str
    version: str

    def __str__(self) -> str:
        return f"{self.distribution} {self.version} (plugin {self.plugin!r})".replace("  ", " ")


@dataclass(frozen=True)
class Conflict:
    """Names (``(kind, name)``: modality, tower, verb, backend) that several plugins claim."""

    names: tuple[tuple[str, str], ...]
    claimants: tuple[Claimant, ...]

    def message(self) -> str:
        who = " and ".join(str(c) for c in self.claimants)
        parts = [f"the {kind} {name!r}" for kind, name in self.names]
        what = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
        fix = " or ".join(f"{BLOCK_ENV}={c.plugin}" for c in self.claimants)
        return f"{who} both claim {what}; neither claim is used. Uninstall one, or block one with {fix}"


@dataclass(frozen=True)
class _Loaded:
    """What one registered plugin's hooks yielded."""

    who: Claimant
    modalities: tuple[Modality, ...]
    backends: tuple[Backend, ...]


def _claims(m: Modality) -> Iterator[tuple[str, str]]:
    yield "modality", m.name
    yield "tower", m.tower.name
    for verb in m.verbs:
        yield "verb", verb


class _Refused(Exception):
    """A plugin refused at registration; the message is the whole reason."""


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
        self._entries: list[PluginRecord | _Loaded] = []  # in discovery order
        self._withheld: dict[tuple[str, str], Conflict] = {}  # contested (kind, name) → its conflict
        self._withheld_modalities: list[tuple[Modality, Conflict]] = []
        self._withheld_backends: list[tuple[Backend, Conflict]] = []

    # -- discovery -----------------------------------------------------------------------

    def discover(self, group: str = hookspecs.PROJECT) -> None:
        """Load every entry point of ``group``; record failures instead of raising them."""
        seen = set()
        for ep in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
            dist = ep.dist.name if ep.dist else "<unknown>"
            version = ep.dist.version if ep.dist else ""
            seen.add(ep.name)
            if ep.name in self.blocked:
                self._record(PluginRecord(ep.name, dist, version, "", "blocked", (), f"blocked by {BLOCK_ENV} or Host(blocked=...)"))
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the rest
                self._failed(ep.name, dist, version, f"import failed: {type(exc).__name__}: {exc}")
                continue
            self.add(plugin, ep.name, dist, version)
        unknown = sorted(self.blocked - seen)
        if unknown:
            msg = f"{BLOCK_ENV} names {', '.join(map(repr, unknown))}, which no installed uform plugin is called; `uform plugins` lists their names"
            log.warning(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=2)

    def add(self, plugin: Any, name: str, distribution: str = "<local>", version: str = "") -> None:
        """Register one plugin object or module and collect what its hooks yield."""
        if name in self.blocked:
            self._record(PluginRecord(name, distribution, version, "", "blocked", (), f"blocked by {BLOCK_ENV} or Host(blocked=...)"))
            return
        try:
            unmarked = self._unmarked_hooks(plugin)
            if unmarked:
                raise _Refused(
                    f"{', '.join(unmarked)} {'is' if len(unmarked) == 1 else 'are'} not marked with @uform.hookimpl, "
                    "so uform never calls it; mark it"
                )
            extra = self._unknown_arguments(plugin)
            if extra:
                raise _Refused(extra)
            self.manager.register(plugin, name=name)
            try:
                self.manager.check_pending()
            except pluggy.PluginValidationError:
                raise _Refused(self._unknown_hooks(plugin)) from None
            modalities = self._hook(plugin, "uform_modalities")
            backends = self._hook(plugin, "uform_backends")
            for m in modalities:
                if not isinstance(m, Modality):
                    raise TypeError(f"uform_modalities yielded {type(m).__name__}, not Modality")
            for b in backends:
                if not isinstance(b, Backend):
                    raise TypeError(f"uform_backends yielded {type(b).__name__}, not Backend")
        except Exception as exc:  # noqa: BLE001
            if self.manager.is_registered(plugin):
                self.manager.unregister(plugin)
            refused = isinstance(exc, (_Refused, pluggy.PluginValidationError))
            reason = " ".join(str(exc).split()) if refused else f"{type(exc).__name__}: {exc}"
            self._failed(name, distribution, version, reason)
            return
        self._entries.append(_Loaded(Claimant(name, distribution, version), tuple(modalities), tuple(backends)))
        self._resolve()

    def _hook(self, plugin: Any, hook: str) -> list[Any]:
        """What ``plugin``'s implementation of ``hook`` yields, called through the manager."""
        others = [p for p in self.manager.get_plugins() if p is not plugin]
        caller = self.manager.subset_hook_caller(hook, remove_plugins=others)
        return [item for result in caller() for item in (result or ())]

    def _specs(self) -> list[str]:
        return sorted(n for n, c in vars(self.manager.hook).items() if not n.startswith("_") and c.has_spec())

    def _unmarked_hooks(self, plugin: Any) -> list[str]:
        specs = self._specs()
        return sorted(
            n for n in specs
            if callable(getattr(plugin, n, None)) and not hasattr(getattr(plugin, n), f"{hookspecs.PROJECT}_impl")
        )  # fmt: skip

    def _unknown_arguments(self, plugin: Any) -> str:
        """Why a marked hook names arguments its spec lacks ('' when none does)."""
        for hook in self._specs():
            impl = getattr(plugin, hook, None)
            if impl is None or not hasattr(impl, f"{hookspecs.PROJECT}_impl"):
                continue
            spec = inspect.signature(getattr(hookspecs, hook)).parameters
            extra = [p for p in inspect.signature(impl).parameters if p not in spec]
            if extra:
                have = ", ".join(spec) or "no arguments"
                return (
                    f"{hook} names {', '.join(map(repr, extra))}, which the hook does not pass in this uform "
                    f"(hookspec version {hookspecs.SPEC_VERSION}: {hook} takes {have}); upgrade uform or drop the argument"
                )
        return ""

    def _unknown_hooks(self, plugin: Any) -> str:
        specs = self._specs()
        unknown = []
        for caller in self.manager.get_hookcallers(plugin) or []:
            if not caller.has_spec() and any(not i.optionalhook for i in caller.get_hookimpls() if i.plugin is plugin):
                close = difflib.get_close_matches(caller.name, specs, 1)
                unknown.append(f"{caller.name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        return (
            f"unknown hook {', '.join(unknown)}: uform's hooks are {', '.join(specs)}; "
            "a hook of a newer uform is marked @uform.hookimpl(optionalhook=True)"
        )

    def _resolve(self) -> None:
        """Rebuild what is used from every loaded plugin: contested names go to no one."""
        loaded = [e for e in self._entries if isinstance(e, _Loaded)]
        owners: dict[tuple[str, str], list[Claimant]] = {}
        for e in loaded:
            keys = [k for m in e.modalities for k in _claims(m)] + [("backend", b.name) for b in e.backends]
            for key in dict.fromkeys(keys):
                owners.setdefault(key, []).append(e.who)
        groups: dict[tuple[Claimant, ...], list[tuple[str, str]]] = {}
        for key, claimants in owners.items():
            if len(claimants) > 1:
                groups.setdefault(tuple(claimants), []).append(key)
        self.conflicts = [Conflict(tuple(keys), claimants) for claimants, keys in groups.items()]
        contested = {key: c for c in self.conflicts for key in c.names}
        self._withheld = contested
        self.modalities, self.backends, self.records = {}, {}, []
        self._withheld_modalities, self._withheld_backends = [], []
        for entry in self._entries:
            if isinstance(entry, PluginRecord):
                self.records.append(entry)
                continue
            mine: list[Conflict] = []
            modalities, backends = [], []
            for m in entry.modalities:
                hit = [contested[k] for k in _claims(m) if k in contested]
                if hit:
                    self._withheld_modalities.append((m, hit[0]))
                    mine += hit
                else:
                    modalities.append(m)
            for b in entry.backends:
                conflict = contested.get(("backend", b.name))
                if conflict:
                    self._withheld_backends.append((b, conflict))
                    mine.append(conflict)
                else:
                    backends.append(b)
            self.modalities.update((m.name, m) for m in modalities)
            self.backends.update((b.name, b) for b in backends)
            kind = "+".join(k for k, items in (("modality", entry.modalities), ("backend", entry.backends)) if items)
            provides = tuple(m.name for m in modalities) + tuple(b.name for b in backends)
            status = "conflict" if mine else "ok"
            error = "; ".join(dict.fromkeys(c.message() for c in mine))  # one message per rival
            who = entry.who
            self.records.append(PluginRecord(who.plugin, who.distribution, who.version, kind, status, provides, error))

    def _record(self, record: PluginRecord) -> None:
        self._entries.append(record)
        self.records.append(record)

    def _failed(self, name: str, distribution: str, version: str, error: str) -> None:
        msg = f"uform plugin {name!r} from {distribution} {version} is unusable and was skipped: {error}"
        log.warning(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        self._record(PluginRecord(name, distribution, version, "", "failed", (), error))

    # -- lookups -------------------------------------------------------------------------

    def tower_owner(self, tower: str) -> Modality | None:
        """The modality running ``tower``; PluginConflictError when plugins contest it."""
        for m, conflict in self._withheld_modalities:
            if m.tower.name == tower:
                raise PluginConflictError(f"tower {tower!r}: {conflict.message()}")
        return next((m for m in self.modalities.values() if m.tower.name == tower), None)

    def verb(self, name: str) -> Modality:
        """The modality providing verb ``name``; PluginConflictError when plugins contest it,
        UnsupportedError when no installed plugin provides it."""
        conflict = self._withheld.get(("verb", name))
        if conflict is not None:
            raise PluginConflictError(f"verb {name!r}: {conflict.message()}")
        for m in self.modalities.values():
            if name in m.verbs:
                return m
        raise UnsupportedError(f"no installed plugin provides {name}; `uform plugins` lists what is installed")

    def backends_for(self, placement: str) -> list[Backend]:
        """Backends of ``placement``, best first; PluginConflictError when one of them is contested."""
        for b, conflict in self._withheld_backends:
            if b.placement == placement:
                raise PluginConflictError(f"placing in {placement.upper()}: {conflict.message()}")
        found = [b for b in self.backends.values() if b.placement == placement]
        return sorted(found, key=lambda b: -b.priority)


_host: Host | None = None
_lock = threading.Lock()


def get_host() -> Host:
    """The process-wide host, discovering plugins on first use (``UFORM_BLOCK_PLUGINS`` is read then)."""
    global _host
    with _lock:
        if _host is None:
            host = Host(blocked_from_env())
            host.discover()
            _host = host
        return _host


def reset_host() -> None:
    """Forget the discovered plugins; the next :func:`get_host` discovers again."""
    global _host
    with _lock:
        _host = None
