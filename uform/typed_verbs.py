"""``TypedVerbs``: the modality verbs of the API page, typed as it states them.

``Model`` inherits them; each forwards to ``Model._verb`` by name, which finds the installed
plugin serving that verb (the core knows no modality by name). A third-party modality's verb
needs no line here: ``Model.__getattr__`` reaches it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from .core.arena import Arena, Encoded, RowsTape
from .core.progress import ProgressHandler
from .core.types import Outputs, Scalar

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from .plugins.audio import AudioEncodeStats
    from .plugins.image import ImageEncodeStats
    from .plugins.text import TextEncodeStats
    from .plugins.video import VideoEncodeStats

Texts = Iterable[str | bytes]
Files = Iterable[str | os.PathLike[str] | bytes | BinaryIO]
Words = Sequence[int]


class TypedVerbs:
    """The API page's verbs of the built-in modalities, each forwarded by name to ``_verb``."""

    def _verb(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Runs verb ``name`` (``Model`` defines it: the call, counted by its lifecycle)."""
        raise NotImplementedError

    def text_encode(
        self,
        texts: Texts,
        arena: Arena,
        /,
        *,
        outputs: Outputs = Outputs.EMBEDDINGS,
        outputs_scalar: Scalar = Scalar.F32,
        progress: ProgressHandler | None = None,
        progress_steps: int = 0,
        stats: TextEncodeStats | None = None,
    ) -> Encoded:
        """Encodes UTF-8 texts, a byte per token."""
        return self._verb(  # type: ignore[no-any-return]
            "text_encode", texts, arena, outputs=outputs, outputs_scalar=outputs_scalar,
            progress=progress, progress_steps=progress_steps, stats=stats,
        )  # fmt: skip

    def image_encode(
        self,
        files: Files,
        arena: Arena,
        /,
        *,
        outputs: Outputs = Outputs.EMBEDDINGS,
        outputs_scalar: Scalar = Scalar.F32,
        progress: ProgressHandler | None = None,
        progress_steps: int = 0,
        stats: ImageEncodeStats | None = None,
    ) -> Encoded:
        """Decodes and encodes JPEG, PNG or WebP files (paths, bytes or binary file objects)."""
        return self._verb(  # type: ignore[no-any-return]
            "image_encode", files, arena, outputs=outputs, outputs_scalar=outputs_scalar,
            progress=progress, progress_steps=progress_steps, stats=stats,
        )  # fmt: skip

    def image_encode_pixels(
        self,
        pixels: Sequence[Buffer],
        arena: Arena,
        /,
        *,
        outputs: Outputs = Outputs.EMBEDDINGS,
        outputs_scalar: Scalar = Scalar.F32,
        progress: ProgressHandler | None = None,
        progress_steps: int = 0,
        stats: ImageEncodeStats | None = None,
    ) -> Encoded:
        """Encodes [height, width, 3] uint8 images of up to ``MAX_PIXELS`` pixels, the limit files are held to."""
        return self._verb(  # type: ignore[no-any-return]
            "image_encode_pixels", pixels, arena, outputs=outputs, outputs_scalar=outputs_scalar,
            progress=progress, progress_steps=progress_steps, stats=stats,
        )  # fmt: skip

    def video_encode(
        self,
        files: Files,
        arena: Arena,
        /,
        *,
        outputs: Outputs = Outputs.EMBEDDINGS,
        outputs_scalar: Scalar = Scalar.F32,
        progress: ProgressHandler | None = None,
        progress_steps: int = 0,
        stats: VideoEncodeStats | None = None,
    ) -> Encoded:
        """Decodes and encodes MP4 or WebM clips."""
        return self._verb(  # type: ignore[no-any-return]
            "video_encode", files, arena, outputs=outputs, outputs_scalar=outputs_scalar,
            progress=progress, progress_steps=progress_steps, stats=stats,
        )  # fmt: skip

    def audio_encode(
        self,
        files: Files,
        arena: Arena,
        /,
        *,
        outputs: Outputs = Outputs.EMBEDDINGS,
        outputs_scalar: Scalar = Scalar.F32,
        progress: ProgressHandler | None = None,
        progress_steps: int = 0,
        stats: AudioEncodeStats | None = None,
    ) -> Encoded:
        """Decodes and encodes WAV, FLAC, MP3 or Opus recordings."""
        return self._verb(  # type: ignore[no-any-return]
            "audio_encode", files, arena, outputs=outputs, outputs_scalar=outputs_scalar,
            progress=progress, progress_steps=progress_steps, stats=stats,
        )  # fmt: skip

    def audio_encode_samples(
        self,
        samples: Sequence[Buffer] | RowsTape,
        sample_rate: int,
        arena: Arena,
        /,
        *,
        outputs: Outputs = Outputs.EMBEDDINGS,
        outputs_scalar: Scalar = Scalar.F32,
        progress: ProgressHandler | None = None,
        progress_steps: int = 0,
        stats: AudioEncodeStats | None = None,
    ) -> Encoded:
        """Encodes 1-D float32 mono recordings (a sequence of buffers, or a tape of rows)."""
        return self._verb(  # type: ignore[no-any-return]
            "audio_encode_samples", samples, sample_rate, arena, outputs=outputs, outputs_scalar=outputs_scalar,
            progress=progress, progress_steps=progress_steps, stats=stats,
        )  # fmt: skip

    def text_choose(
        self,
        texts: Texts,
        choices: Texts,
        arena: Arena,
        /,
        *,
        temperature_groups: Words | None = None,
        progress: ProgressHandler | None = None,
        progress_steps: int = 0,
        stats: TextEncodeStats | None = None,
    ) -> RowsTape:
        """Scores each text's single-byte choices, one probability each."""
        return self._verb(  # type: ignore[no-any-return]
            "text_choose", texts, choices, arena, temperature_groups=temperature_groups,
            progress=progress, progress_steps=progress_steps, stats=stats,
        )  # fmt: skip
