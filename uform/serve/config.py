"""Every limit and budget the server enforces, in one record (``uform serve``'s options)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PENDING_BODY_BYTES = 64 << 20


@dataclass(frozen=True)
class ServeConfig:
    """What ``uform serve`` was started with; docs/serve.md lists each with its default.

    Batches: a lane (one verb) takes what is queued when the model frees up, up to
    ``max_batch_items`` items and a cost budget of its kind (``max_batch_tokens`` text bytes,
    ``max_batch_pixels`` image pixels, ``max_batch_bytes`` of video and audio files), after
    waiting ``batch_window_ms`` for more (0: never waits); a request larger than a budget
    runs in a batch of its own.
    ``batching=False`` makes one verb call per request (the benchmark's baseline).
    ``batches_at_once``: verb calls each lane runs at the same time (default 1: one call at a
    time, which on CPUs runs on every core's ONNX Runtime thread).
    Bodies: each at most ``max_request_bytes``; those still arriving hold at most
    ``pending_body_bytes`` between them (503 beyond), and each gets ``body_seconds`` to
    arrive whole (408 beyond): slow clients hold a bounded part of memory for a bounded time.
    ``model_nice``: added to the nice value of the threads that run verbs (the lanes' and
    every thread they start); 0 leaves them as they are. ``uform serve`` sets it
    (``run.MODEL_NICE``) and raises ONNX Runtime's threads made at load by as much, so that
    on busy cores the event loop runs first and the model takes the time it leaves.
    """

    model_id: str = "uform"
    api_key: str | None = None
    media_root: Path | None = None
    max_request_bytes: int = 32 << 20
    # bytes of bodies still arriving held over every connection at once (503 beyond); None:
    # 64 MiB, or twice max_request_bytes where that is more (see pending_body_bytes)
    max_pending_body_bytes: int | None = None
    body_seconds: float = 60.0  # from the start of a body's reading to its last byte (408 beyond)
    max_header_bytes: int = 64 << 10  # a request's line and headers together (431 beyond; serve.guard)
    max_url_bytes: int = 8 << 10  # its URL (414 beyond)
    max_connections: int = 1024  # connections open at once (one more is answered 503; serve.guard)
    header_seconds: float = 10.0  # for a head to arrive whole, from the connection's start or the head's first byte (408 beyond)
    send_seconds: float = 60.0  # a client that reads nothing of what was written to it this long is cut off (serve.guard)
    keep_alive_seconds: int = 5  # an idle connection kept alive after an answer is closed after this (uvicorn's timeout_keep_alive)
    max_items_per_request: int = 2048
    max_queue_items: int = 8192
    max_batch_items: int = 256
    max_batch_tokens: int = 32768
    max_batch_pixels: int = 64 * 640 * 480
    max_batch_bytes: int = 64 << 20
    batch_window_ms: float = 0.0
    batching: bool = True
    batches_at_once: int = 1
    model_nice: int = 0
    drain_seconds: float = 30.0
    retry_after_seconds: int = 1
    inline_json_bytes: int = 64 << 10  # bodies up to this are parsed on the event loop; larger on a thread
    inline_response_values: int = 1 << 15  # responses up to this many scalars are written on the loop

    @property
    def pending_body_bytes(self) -> int:
        """The bytes of bodies still arriving the server holds at once (``max_pending_body_bytes``)."""
        if self.max_pending_body_bytes is not None:
            return self.max_pending_body_bytes
        return max(DEFAULT_PENDING_BODY_BYTES, 2 * self.max_request_bytes)

    def budget(self, kind: str) -> int:
        """The cost budget of one batch of ``kind`` items (text, image, video, audio, choose)."""
        if kind in ("text", "choose"):
            return self.max_batch_tokens
        return self.max_batch_pixels if kind == "image" else self.max_batch_bytes

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_header_bytes", "max_url_bytes", "max_connections", "keep_alive_seconds", "max_items_per_request", "max_queue_items", "max_batch_items", "max_batch_tokens",
                     "max_batch_pixels", "max_batch_bytes", "batches_at_once"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.model_nice <= 19:
            raise ValueError(f"model-nice must be 0-19, got {self.model_nice}")
        if self.pending_body_bytes < self.max_request_bytes:
            raise ValueError(f"max-pending-body-bytes ({self.pending_body_bytes}) must be at least max-request-bytes ({self.max_request_bytes}): "
                             "a body of the largest size could never be read")  # fmt: skip
        if not (math.isfinite(self.body_seconds) and self.body_seconds > 0):
            raise ValueError(f"body-timeout must be a finite number of seconds over 0, got {self.body_seconds}")
        for option, value in (("header-timeout", self.header_seconds), ("send-timeout", self.send_seconds)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{option} must be a finite number of seconds over 0, got {value}")
        for name in ("batch_window_ms", "drain_seconds"):  # NaN compares false to everything; inf overflows the drain's deadline
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name.replace('_', '-')} must be a finite number of 0 or more, got {value}")
        if self.media_root is not None and not self.media_root.is_dir():
            raise ValueError(f"media-root {self.media_root} is not a folder")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api-key must not be empty")


def api_key_from(option: str | None) -> str | None:
    """``--api-key``, else ``UFORM_API_KEY`` from the environment, else no key."""
    if option is not None:
        return option
    return os.environ.get("UFORM_API_KEY") or None
