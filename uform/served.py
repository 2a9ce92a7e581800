"""``Served``: what a load serves, as :attr:`uform.Model.served` answers it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .core.runtime import Runtime


@dataclass(frozen=True)
class Served:
    """What a loaded model serves: its towers, the modalities they belong to, the verbs each
    modality adds to ``Model``, and the temperatures ``text_choose`` divides its logits by.

    Only towers the load placed count: a checkpoint tower whose plugin is not installed is
    skipped at load (with a ``RuntimeWarning``) and appears nowhere here. Each read of
    ``Model.served`` answers a fresh record.
    """

    towers: Mapping[str, str]
    """Each placed tower's name and the name of its modality, in checkpoint order
    (``{"text": "text", "decoder": "choose", ...}``)."""
    modalities: Mapping[str, tuple[str, ...]]
    """Each served modality's name and the verbs it adds, sorted, modalities sorted by name
    (``{"choose": ("text_choose",), "text": ("text_encode",), ...}``)."""
    choice_temperatures: tuple[float, ...]
    """The checkpoint's temperature per ``text_choose`` question group;
    ``len() == describe().choice_temperature_groups``: empty without the byte decoder."""

    @property
    def verbs(self) -> frozenset[str]:
        """Every verb the model serves: the ``Model`` methods that will not raise
        ``UnsupportedError`` for a missing tower."""
        return frozenset(verb for verbs in self.modalities.values() for verb in verbs)


def served_by(runtime: Runtime) -> Served:
    """The record of what ``runtime`` (a load's host record) serves."""
    towers = {name: tower.modality.name for name, tower in runtime.towers.items()}
    modalities: dict[str, set[str]] = {}
    for tower in runtime.towers.values():
        modalities.setdefault(tower.modality.name, set()).update(tower.modality.verbs)
    groups = runtime.describe().choice_temperature_groups
    return Served(
        towers,
        {name: tuple(sorted(verbs)) for name, verbs in sorted(modalities.items())},
        tuple(float(t) for t in runtime.config.choice_temperatures[:groups]),
    )
