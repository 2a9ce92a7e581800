"""``Served``: what a load serves, as :attr:`uform.Model.served` answers it; and the one table
of which verb encodes each kind of item, which every caller of the verbs reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

# a text's UTF-8 checks, refused in the verbs' own words (InputError naming the item): for the
# verbs' callers that check texts before a call (the server), so that the words are written once
from .plugins.media.text import text_of as text_of, utf8_of as utf8_of

if TYPE_CHECKING:
    from .core.runtime import Runtime

# Each kind of item and the Model verb that encodes a batch of them: what the CLI's walks and
# the index (uform.inputs), the server's lanes, Ray's Encoder, the demo's suites and the training's
# held-out reading call. A modality's plugin provides the verbs themselves (docs/plugins.md) and ``Model.served``
# says which of them a load serves; a kind whose verb a load does not serve is refused by it.
ENCODE_VERBS: Mapping[str, str] = MappingProxyType({
    "text": "text_encode",                    # texts: str, or UTF-8 bytes
    "image": "image_encode",                  # image files: paths or encoded bytes (JPEG, PNG, WebP)
    "image_pixels": "image_encode_pixels",    # decoded pictures: [height, width, 3] uint8 arrays
    "video": "video_encode",                  # video files: paths or bytes
    "audio": "audio_encode",                  # audio files: paths or bytes
    "audio_samples": "audio_encode_samples",  # decoded sound: 1-D float32 mono arrays at a sample rate
})  # fmt: skip
DECODED_KINDS = frozenset({"image_pixels", "audio_samples"})
"""The kinds whose items are decoded arrays rather than texts or media files."""
ITEM_VERBS: Mapping[str, str] = MappingProxyType({k: v for k, v in ENCODE_VERBS.items() if k not in DECODED_KINDS})
"""A text or a media file's modality, and its verb (``{"text": "text_encode", "image": "image_encode", ...}``)."""
CHOOSE_VERB = "text_choose"
"""The verb that answers questions (the ``choose`` modality's)."""


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
