"""The plugin host: finds plugins through the ``uform`` entry-point group and collects their records.

Built-in plugins are found exactly like third-party ones. A plugin that fails to import,
or whose hook raises, is reported (a warning, and ``uform plugins`` lists it as failed with
the reason) and the others keep working. Two plugins claiming one name raise
:class:`~uform.PluginConflictError` naming both distributions.
"""

from __future__ import annotations

import importlib.metadata as metadata
import logging
import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pluggy

from . import hookspecs
from .errors import PluginConflictError, UnsupportedError
from .plugin import Backend, Modality

log = logging.getLogger("uform.plugins")


@dataclass(frozen=True)
class PluginRecord:
    """One plugin as ``uform plugins`` shows it."""

    name: str
    distribution: str
    version: str
    kind: str  # "modality", "backend", "modality+backend", or "" when it provides nothing
    status: str  # "ok" or "failed"
    provides: tuple[str, ...] = ()
    error: str = ""


class Host:
    """The loaded plugins: modalities by name and by tower, verbs, and backends."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(hookspecs.PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.records: list[PluginRecord] = []
        self.modalities: dict[str, Modality] = {}
        self.backends: dict[str, Backend] = {}
        self._owner: dict[tuple[str, str], str] = {}  # (kind, name) → distribution

    # -- discovery -----------------------------------------------------------------------

    def discover(self, group: str = hookspecs.PROJECT) -> None:
        """Load every entry point of ``group``; record failures instead of raising them."""
        for ep in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
            dist = ep.dist.name if ep.dist else "<unknown>"
            version = ep.dist.version if ep.dist else ""
            try:
                plugin = ep.load()
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the rest
                self._failed(ep.name, dist, version, f"import failed: {type(exc).__name__}: {exc}")
                continue
            self.add(plugin, ep.name, dist, version)

    def add(self, plugin: Any, name: str, distribution: str = "<local>", version: str = "") -> None:
        """Register one plugin object or module and collect what its hooks yield."""
        try:
            self.manager.register(plugin, name=name)
            modalities = self._call(plugin, "uform_modalities")
            backends = self._call(plugin, "uform_backends")
            for m in modalities:
                if not isinstance(m, Modality):
                    raise TypeError(f"uform_modalities yielded {type(m).__name__}, not Modality")
            for b in backends:
                if not isinstance(b, Backend):
                    raise TypeError(f"uform_backends yielded {type(b).__name__}, not Backend")
        except PluginConflictError:
            raise
        except Exception as exc:  # noqa: BLE001
            if self.manager.is_registered(plugin):
                self.manager.unregister(plugin)
            self._failed(name, distribution, version, f"{type(exc).__name__}: {exc}")
            return
        owner = f"{distribution} (plugin {name!r})"
        for m in modalities:
            self._claim("modality", m.name, owner)
            self._claim("tower", m.tower.name, owner)
            for verb in m.verbs:
                self._claim("verb", verb, owner)
        for b in backends:
            self._claim("backend", b.name, owner)
        self.modalities.update((m.name, m) for m in modalities)
        self.backends.update((b.name, b) for b in backends)
        kind = "+".join(k for k, items in (("modality", modalities), ("backend", backends)) if items)
        provides = tuple(m.name for m in modalities) + tuple(b.name for b in backends)
        self.records.append(PluginRecord(name, distribution, version, kind, "ok", provides))

    def _call(self, plugin: Any, hook: str) -> list[Any]:
        impl = getattr(plugin, hook, None)
        if impl is None:
            return []
        result: Iterable[Any] = impl()
        return list(result or ())

    def _claim(self, kind: str, name: str, owner: str) -> None:
        first = self._owner.setdefault((kind, name), owner)
        if first != owner:
            raise PluginConflictError(
                f"two plugins claim the {kind} {name!r}: {first} and {owner}; uninstall one of them"
            )

    def _failed(self, name: str, distribution: str, version: str, error: str) -> None:
        msg = f"uform plugin {name!r} from {distribution} {version} is unusable and was skipped: {error}"
        log.warning(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        self.records.append(PluginRecord(name, distribution, version, "", "failed", (), error))

    # -- lookups -------------------------------------------------------------------------

    def tower_owner(self, tower: str) -> Modality | None:
        return next((m for m in self.modalities.values() if m.tower.name == tower), None)

    def verb(self, name: str) -> Modality:
        for m in self.modalities.values():
            if name in m.verbs:
                return m
        raise UnsupportedError(f"no installed plugin provides {name}; `uform plugins` lists what is installed")

    def backends_for(self, placement: str) -> list[Backend]:
        found = [b for b in self.backends.values() if b.placement == placement]
        return sorted(found, key=lambda b: -b.priority)


_host: Host | None = None
_lock = threading.Lock()


def get_host() -> Host:
    """The process-wide host, discovering plugins on first use."""
    global _host
    with _lock:
        if _host is None:
            host = Host()
            host.discover()
            _host = host
        return _host


def reset_host() -> None:
    """Forget the discovered plugins; the next :func:`get_host` discovers again."""
    global _host
    with _lock:
        _host = None
