"""Which modalities and verbs a loaded model serves (``Model.served``, in the server's shapes),
and which verb serves each kind of item. Light on purpose: no server imports."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from uform import Model

# the verb the server calls for each kind of item it accepts
ITEM_VERBS = {"text": "text_encode", "image": "image_encode", "video": "video_encode", "audio": "audio_encode"}
CHOOSE_VERB = "text_choose"


def served(model: Model) -> dict[str, list[str]]:
    """Each modality the checkpoint holds (with an installed plugin), and the verbs it adds,
    sorted by modality name (``Model.served.modalities`` as lists)."""
    return {name: list(verbs) for name, verbs in model.served.modalities.items()}


def verbs(model: Model) -> set[str]:
    """Every verb the model serves."""
    return set(model.served.verbs)
