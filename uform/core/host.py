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
import re
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy

from . import hookspecs
from .errors import PluginConflictError, PluginError, UformError, UnsupportedError
from .plugin import MODEL_NAMES, Backend, LoadRequest, Modality, Placement, TensorSpec, Tower

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
        names = list(dict.fromkeys(c.plugin for c in self.claimants))
        if len(names) < len(self.claimants):  # two distributions' entry points of one name: blocking it blocks both
            return f"{who} both claim {what}; neither claim is used. Uninstall one ({BLOCK_ENV}={names[0]} would block both)"
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


_ENTRY_POINT = re.compile(r"\s*[\w.]+\s*(:\s*[\w.]+\s*)?(\[.*\]\s*)?")  # module, or module:object, [extras]


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _is_verb(value: Any) -> bool:
    return isinstance(value, str) and value.isidentifier() and not value.startswith("_") and value not in MODEL_NAMES


def _shown(value: Any) -> str:
    return repr(value) if value is None or isinstance(value, (str, int, float)) else type(value).__name__


_Check = tuple[str, Any, Callable[[Any], bool], str]  # field, its value, whether it is right, what it should be


def _wrong_fields(record: Modality | Backend) -> list[str]:
    """The fields of ``record`` that are not what docs/plugins.md says they are ([] when none)."""
    checks: list[_Check] = []
    if isinstance(record, Modality):
        tower, verbs = record.tower, record.verbs
        checks += [("name", record.name, _is_name, "a non-empty str"), ("tower", tower, lambda v: isinstance(v, Tower), "a Tower")]
        if isinstance(tower, Tower):
            checks += [
                ("tower.name", tower.name, _is_name, "a non-empty str"),
                ("tower.presets", tower.presets, lambda v: isinstance(v, Mapping), "a mapping"),
            ]  # fmt: skip
            checks += [(f"tower.{f}", getattr(tower, f), callable, "callable") for f in ("read", "tensors", "graph")]
        checks.append(("verbs", verbs, lambda v: isinstance(v, Mapping), "a mapping of verb name to function"))
        if isinstance(verbs, Mapping):
            for verb, fn in verbs.items():
                checks += [
                    ("a verb's name", verb, _is_verb, "an identifier that does not start with '_' and is not a name of Model's own (describe, close, ...)"),
                    (f"verbs[{verb!r}]", fn, callable, "callable"),
                ]  # fmt: skip
        checks.append(("describe", record.describe, lambda v: v is None or callable(v), "None or callable"))
    else:
        checks += [
            ("name", record.name, _is_name, "a non-empty str"),
            ("placement", record.placement, lambda v: v in ("ram", "vram"), "'ram' or 'vram'"),
        ]  # fmt: skip
        checks += [(f, getattr(record, f), callable, "callable") for f in ("probe", "open", "accepts")]
        checks += [
            ("priority", record.priority, lambda v: isinstance(v, int) and not isinstance(v, bool), "an int"),
            ("detail", record.detail, lambda v: v is None or callable(v), "None or callable"),
        ]  # fmt: skip
    return [f"{field} is {_shown(value)}, not {expected}" for field, value, right, expected in checks if not right(value)]


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
        self._backend_owners: dict[str, Claimant] = {}
        self._modality_owners: dict[str, Claimant] = {}
        self._groups: set[str] = set()  # the entry-point groups discover() has read
        self._discovered: set[tuple[str, str, str, str]] = set()  # (group, name, value, distribution) taken

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
            if not _ENTRY_POINT.fullmatch(ep.value):
                self._failed(ep.name, dist, version, f"its entry point's value {ep.value!r} is not 'module' or 'module:object'")
                continue
            try:
                plugin = ep.load()
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - a broken plugin must not break the rest
                self._failed(ep.name, dist, version, f"import failed: {type(exc).__name__}: {exc}")
                continue
            self.add(plugin, ep.name, dist, version)
        unknown = sorted(self.blocked - seen)
        if unknown and not again:
            msg = f"{BLOCK_ENV} names {', '.join(map(repr, unknown))}, which no installed uform plugin is called; `uform plugins` lists their names"
            log.warning(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=2)

    def add(self, plugin: Any, name: str, distribution: str = "<local>", version: str = "") -> None:
        """Register one plugin object or module and collect what its hooks yield."""
        if name in self.blocked:
            self._record(PluginRecord(name, distribution, version, "", "blocked", (), f"blocked by {BLOCK_ENV} or Host(blocked=...)"))
            return
        registered = False
        try:
            other = self.manager.get_name(plugin)
            if other is not None:
                raise _Refused(
                    f"its module {getattr(plugin, '__name__', plugin)!r} is registered already, as plugin {other!r}; "
                    "a module is one plugin: declare one entry point for it"
                )
            if inspect.isclass(plugin):
                raise _Refused(
                    f"the entry point names the class {plugin.__name__}, whose hooks would be called without an "
                    "instance: name a module, or an instance of it (plugin = " + plugin.__name__ + "())"
                )
            if callable(plugin) and hasattr(plugin, f"{hookspecs.PROJECT}_impl"):
                raise _Refused(
                    f"the entry point names the hook function {getattr(plugin, '__name__', '?')} itself: "
                    "name the module (or object) that holds it"
                )
            unmarked = self._unmarked_hooks(plugin)
            if unmarked:
                raise _Refused(
                    f"{', '.join(unmarked)} {'is' if len(unmarked) == 1 else 'are'} not marked with @uform.hookimpl, "
                    "so uform never calls it; mark it"
                )
            extra = self._unknown_arguments(plugin)
            if extra:
                raise _Refused(extra)
            self.manager.register(plugin, name=self._unused_name(name, distribution))
            registered = True
            try:
                self.manager.check_pending()
            except pluggy.PluginValidationError:
                raise _Refused(self._unknown_hooks(plugin)) from None
            if not self.manager.get_hookcallers(plugin):
                raise _Refused(
                    f"{getattr(plugin, '__name__', type(plugin).__name__)!r} has no function marked @uform.hookimpl "
                    f"(uform's hooks are {', '.join(self._specs())}): the entry point names something that is not a uform plugin"
                )
            modalities = self._hook(plugin, "uform_modalities")
            backends = self._hook(plugin, "uform_backends")
            self._check_records("uform_modalities", modalities, Modality)
            self._check_records("uform_backends", backends, Backend)
        except (Exception, SystemExit) as exc:  # noqa: BLE001
            if registered:
                self.manager.unregister(plugin)
            refused = isinstance(exc, (_Refused, pluggy.PluginValidationError))
            reason = " ".join(str(exc).split()) if refused else f"{type(exc).__name__}: {exc}"
            self._failed(name, distribution, version, reason)
            return
        self._entries.append(_Loaded(Claimant(name, distribution, version), tuple(modalities), tuple(backends)))
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
        _Refused naming the hook when it raises or answers something that is not iterable."""
        others = [p for p in self.manager.get_plugins() if p is not plugin]
        caller = self.manager.subset_hook_caller(hook, remove_plugins=others)
        try:
            items = []
            for result in caller():
                if result is not None and not isinstance(result, Iterable):
                    raise _Refused(f"{hook} returned {type(result).__name__}, not an iterable of records")
                items += list(result or ())
            return items
        except _Refused:
            raise
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the plugin's failure, named
            raise _Refused(f"{hook} raised {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _check_records(hook: str, records: list[Any], kind: type[Modality] | type[Backend]) -> None:
        """_Refused naming the first record of ``hook`` that is not a well-formed ``kind``, or a
        name (modality, tower, verb, backend) it yields twice."""
        for r in records:
            if not isinstance(r, kind):
                raise _Refused(f"{hook} yielded {type(r).__name__}, not {kind.__name__}")
            wrong = _wrong_fields(r)
            if wrong:
                raise _Refused(f"{hook} yielded the {kind.__name__} {_shown(r.name)} whose {'; '.join(wrong)}")
        claims = [k for r in records for k in (_claims(r) if isinstance(r, Modality) else [("backend", r.name)])]
        twice = list(dict.fromkeys(k for k in claims if claims.count(k) > 1))
        if twice:
            what = ", ".join(f"the {kind} {name!r}" for kind, name in twice)
            raise _Refused(f"{hook} yielded {what} twice; each name is one record")

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
        self._backend_owners = {b.name: e.who for e in loaded for b in e.backends}
        self._modality_owners = {m.name: e.who for e in loaded for m in e.modalities}
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
        placement = backend.open(request)
        if not isinstance(placement, Placement):
            wrong = f"{_shown(placement)}, not a Placement"
        else:
            runners = placement.runners if isinstance(placement.runners, Mapping) else {}
            lacking = [t for t in request.towers if not callable(getattr(runners.get(t), "run", None))]
            wrong = f"a Placement without a runner (an object with run) for the tower(s) {', '.join(map(repr, lacking))}" if lacking else ""
        if wrong:
            raise PluginError(f"backend {backend.name!r}: its open answered {wrong}; {self._fix(backend)}")
        return placement

    def _fix(self, backend: Backend) -> str:
        return _fix(self._backend_owners.get(backend.name))

    def tower_call(self, modality: Modality, what: str, *args: Any) -> Any:
        """``modality.tower.<what>(*args)`` (``read``, ``tensors``, ``graph``): uform's own errors (a
        CheckpointError naming a field) as raised; any other exception, and ``tensors`` answering
        something other than a mapping of tensor name to TensorSpec, PluginError naming the plugin."""
        tower, fix = modality.tower, _fix(self._modality_owners.get(modality.name))
        try:
            answer = getattr(tower, what)(*args)
        except UformError:
            raise
        except Exception as exc:  # noqa: BLE001 - the plugin's bug, named
            raise PluginError(f"tower {tower.name!r}: its {what} raised {type(exc).__name__}: {exc}; {fix}") from exc
        wrong = _wrong_specs(answer) if what == "tensors" else ""
        if wrong:
            raise PluginError(f"tower {tower.name!r}: its tensors answered {wrong}; {fix}")
        return dict(answer) if what == "tensors" else answer

    def _asked(self, backend: Backend, what: str, ask: Callable[[], Any]) -> str | None:
        fix = self._fix(backend)
        try:
            reason = ask()
        except Exception as exc:  # noqa: BLE001 - the plugin's failure, named
            wrong = f"its {what} raised {type(exc).__name__}: {exc}; {fix}"
        else:
            if reason is None or isinstance(reason, str):
                return reason
            wrong = f"its {what} answered {_shown(reason)}, not None ({'available' if what == 'probe' else 'accepted'}) or a reason (str); {fix}"
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


def _wrong_specs(specs: Any) -> str:
    """What is wrong with a tower's ``tensors`` answer ('' when it is a mapping of name to TensorSpec)."""
    if not isinstance(specs, Mapping):
        return f"{_shown(specs)}, not a mapping of tensor name to TensorSpec"
    for name, spec in specs.items():
        if not _is_name(name):
            return f"the tensor name {_shown(name)}, not a non-empty str"
        if not isinstance(spec, TensorSpec):
            return f"{_shown(spec)} for {name!r}, not a TensorSpec"
        shape = spec.shape
        if not isinstance(shape, tuple) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            return f"the shape {_shown(shape)} for {name!r}, not a tuple of ints (0 or more)"
    return ""


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
