"""The records of the loaded plugins and the names they claim, and who gets each name.

:class:`PluginRecord` is a plugin as ``uform plugins`` shows it; :class:`Loaded` is what one
registered plugin's hooks yielded, by :class:`Claimant`. :func:`resolve` turns the host's
entries (in discovery order) into what is used: two plugins claiming one modality, tower, verb
or backend name are a :class:`Conflict`, and neither claim is used; the rest are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .plugin import Backend, Modality
from .wellformed import claims

BLOCK_ENV = "UFORM_BLOCK_PLUGINS"


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
class Loaded:
    """What one registered plugin's hooks yielded."""

    who: Claimant
    modalities: tuple[Modality, ...]
    backends: tuple[Backend, ...]


@dataclass
class Resolution:
    """What is used of the loaded plugins, and what is withheld because plugins contest it."""

    records: list[PluginRecord] = field(default_factory=list)
    modalities: dict[str, Modality] = field(default_factory=dict)
    backends: dict[str, Backend] = field(default_factory=dict)
    conflicts: list[Conflict] = field(default_factory=list)
    withheld: dict[tuple[str, str], Conflict] = field(default_factory=dict)  # contested (kind, name) → its conflict
    withheld_modalities: list[tuple[Modality, Conflict]] = field(default_factory=list)
    withheld_backends: list[tuple[Backend, Conflict]] = field(default_factory=list)
    backend_owners: dict[str, Claimant] = field(default_factory=dict)
    modality_owners: dict[str, Claimant] = field(default_factory=dict)


def resolve(entries: Sequence[PluginRecord | Loaded]) -> Resolution:
    """What is used of every loaded plugin in ``entries``: contested names go to no one."""
    loaded = [e for e in entries if isinstance(e, Loaded)]
    owners: dict[tuple[str, str], list[Claimant]] = {}
    for e in loaded:
        keys = [k for m in e.modalities for k in claims(m)] + [("backend", b.name) for b in e.backends]
        for key in dict.fromkeys(keys):
            owners.setdefault(key, []).append(e.who)
    groups: dict[tuple[Claimant, ...], list[tuple[str, str]]] = {}
    for key, claimants in owners.items():
        if len(claimants) > 1:
            groups.setdefault(tuple(claimants), []).append(key)
    out = Resolution(conflicts=[Conflict(tuple(keys), claimants) for claimants, keys in groups.items()])
    contested = {key: c for c in out.conflicts for key in c.names}
    out.withheld = contested
    out.backend_owners = {b.name: e.who for e in loaded for b in e.backends}
    out.modality_owners = {m.name: e.who for e in loaded for m in e.modalities}
    for entry in entries:
        if isinstance(entry, PluginRecord):
            out.records.append(entry)
            continue
        mine: list[Conflict] = []
        modalities, backends = [], []
        for m in entry.modalities:
            hit = [contested[k] for k in claims(m) if k in contested]
            if hit:
                out.withheld_modalities.append((m, hit[0]))
                mine += hit
            else:
                modalities.append(m)
        for b in entry.backends:
            conflict = contested.get(("backend", b.name))
            if conflict:
                out.withheld_backends.append((b, conflict))
                mine.append(conflict)
            else:
                backends.append(b)
        out.modalities.update((m.name, m) for m in modalities)
        out.backends.update((b.name, b) for b in backends)
        kind = "+".join(k for k, items in (("modality", entry.modalities), ("backend", entry.backends)) if items)
        provides = tuple(m.name for m in modalities) + tuple(b.name for b in backends)
        status = "conflict" if mine else "ok"
        error = "; ".join(dict.fromkeys(c.message() for c in mine))  # one message per rival
        who = entry.who
        out.records.append(PluginRecord(who.plugin, who.distribution, who.version, kind, status, provides, error))
    return out
