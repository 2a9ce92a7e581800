"""Which modalities and verbs a loaded model serves, and which verb serves each kind of item.

Light on purpose (no server imports): ``uform describe`` uses it too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from uform import Model

# the verb the server calls for each kind of item it accepts
ITEM_VERBS = {"text": "text_encode", "image": "image_encode", "video": "video_encode", "audio": "audio_encode"}
CHOOSE_VERB = "text_choose"


def served(model: Model) -> dict[str, list[str]]:
    """Each modality the checkpoint holds (with an installed plugin), and the verbs it adds,
    sorted by modality name."""
    towers = model._runtime.towers  # noqa: SLF001 - the host's own record of what this load serves
    modalities: dict[str, list[str]] = {}
    for tower in towers.values():
        modalities.setdefault(tower.modality.name, []).extend(tower.modality.verbs)
    return {name: sorted(set(verbs)) for name, verbs in sorted(modalities.items())}


def verbs(model: Model) -> set[str]:
    """Every verb the model serves."""
    return {verb for names in served(model).values() for verb in names}
