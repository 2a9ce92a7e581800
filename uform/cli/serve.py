"""``uform serve``: the OpenAI-compatible embeddings server (docs/serve.md; the ``uform[serve]`` extra)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..core.executor import MAX_THREADS
from .common import add_model, model_path


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve the model over HTTP: OpenAI's embeddings API for every modality, with dynamic batching")
    add_model(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default 8000; 0 picks a free one)")
    p.add_argument("--devices", default=None, metavar="0,1", help="GPU ids: serve from GPUs through load_vram (default: load_ram)")
    p.add_argument("--model-name", default=None, help="the model id clients name (default: the checkpoint's file name without .safetensors)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every route but /health (default: $UFORM_API_KEY, else none)")
    p.add_argument("--media-root", type=Path, default=None, metavar="DIR", help="serve file:// URLs of files inside DIR (default: refused)")
    p.add_argument("--max-request-bytes", type=int, default=32 << 20, help="largest request body (default 32 MiB; 413 beyond)")
    p.add_argument("--max-pending-body-bytes", type=int, default=None, metavar="N",
                   help="most bytes of request bodies still arriving held at once, over every connection (default 64 MiB, or twice "
                        "--max-request-bytes where that is more; 503 with Retry-After beyond)")  # fmt: skip
    p.add_argument("--body-timeout", type=float, default=60.0, metavar="S",
                   help="seconds a request's body may take to arrive whole (default 60; 408 beyond)")
    p.add_argument("--max-header-bytes", type=int, default=64 << 10, help="largest request line and headers together (default 64 KiB; 431 beyond)")
    p.add_argument("--max-url-bytes", type=int, default=8 << 10, help="largest URL (default 8 KiB; 414 beyond)")
    p.add_argument("--max-connections", type=int, default=1024, metavar="N",
                   help="most connections open at once (default 1024; one more is answered 503 with Retry-After and closed)")
    p.add_argument("--header-timeout", type=float, default=10.0, metavar="S",
                   help="seconds a request's head may take to arrive whole, from the connection's start or the head's first byte (default 10; 408 beyond)")
    p.add_argument("--send-timeout", type=float, default=60.0, metavar="S",
                   help="seconds a client may leave an answer unread (the server's send buffer full) before it is cut off (default 60)")
    p.add_argument("--keep-alive-seconds", type=int, default=5, metavar="S",
                   help="whole seconds a connection kept alive after an answer may stay idle before it is closed (default 5)")
    p.add_argument("--max-items", type=int, default=2048, help="most items one request may hold (default 2048)")
    p.add_argument("--max-queue-items", type=int, default=8192, help="most items queued at once (default 8192; 429 beyond)")
    p.add_argument("--max-batch-items", type=int, default=256, help="most items one verb call takes (default 256)")
    p.add_argument("--max-batch-tokens", type=int, default=32768, help="most text bytes one text call takes (default 32768)")
    p.add_argument("--max-batch-pixels", type=int, default=64 * 640 * 480, help="most image pixels one image call takes (default 64 × 640 × 480)")
    p.add_argument("--max-batch-bytes", type=int, default=64 << 20, help="most video or audio bytes one call takes (default 64 MiB)")
    p.add_argument("--batch-window-ms", type=float, default=0.0, help="wait this long for more items once a batch has one (default 0: never)")
    p.add_argument("--no-batching", action="store_true", help="one verb call per request (a baseline to compare with)")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads a verb call uses on CPUs (default 0: every core, the library's default)")
    p.add_argument("--batches-at-once", type=int, default=1, metavar="N",
                   help="verb calls each lane runs at the same time (default 1: one call at a time, on every core)")  # fmt: skip
    p.add_argument("--model-nice", type=int, default=10, metavar="N",
                   help="added to the nice value of the threads that run the model, so the event loop goes first (0-19, default 10; 0: unchanged)")
    p.add_argument("--drain-seconds", type=float, default=30.0, help="on SIGTERM, how long in-flight requests get (default 30)")
    p.add_argument("--no-access-log", action="store_true", help="log no line per request")
    p.set_defaults(run=_serve)


def _serve(args: argparse.Namespace) -> int:
    try:
        from uform.serve.config import ServeConfig, api_key_from
        from uform.serve.run import load, serve  # with serve.guard, which needs httptools: without it, no h11 fallback
    except ImportError as exc:
        raise ValueError(f"uform serve needs the serve extra: pip install 'uform[serve]' ({exc})") from None
    try:
        import orjson  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"uform serve needs the serve extra: pip install 'uform[serve]' ({exc})") from None
    devices = _devices(args.devices)
    if not 0 <= args.threads <= MAX_THREADS:
        raise ValueError(f"--threads must be 0-{MAX_THREADS} (0: every core), got {args.threads}")
    if not 0 <= args.model_nice <= 19:
        raise ValueError(f"--model-nice must be 0-19, got {args.model_nice}")
    if not 0 <= args.port <= 65535:  # the resolver would take 70000 as 4464 and listen there
        raise ValueError(f"--port must be 0-65535 (0 picks a free one), got {args.port}")
    name = args.model_name or model_path(args).name.removesuffix(".safetensors")
    config = ServeConfig(
        model_id=name, api_key=api_key_from(args.api_key), media_root=args.media_root, max_request_bytes=args.max_request_bytes,
        max_pending_body_bytes=args.max_pending_body_bytes, body_seconds=args.body_timeout,
        max_header_bytes=args.max_header_bytes, max_url_bytes=args.max_url_bytes, max_connections=args.max_connections, header_seconds=args.header_timeout, send_seconds=args.send_timeout,
        keep_alive_seconds=args.keep_alive_seconds, max_items_per_request=args.max_items, max_queue_items=args.max_queue_items, max_batch_items=args.max_batch_items,
        max_batch_tokens=args.max_batch_tokens, max_batch_pixels=args.max_batch_pixels, max_batch_bytes=args.max_batch_bytes,
        batch_window_ms=args.batch_window_ms, batching=not args.no_batching, drain_seconds=args.drain_seconds,
        batches_at_once=args.batches_at_once,
    )  # fmt: skip
    model, executor = load(args.model, args.quantization, devices, args.threads or None)
    return serve(model, config, host=args.host, port=args.port, access_log=not args.no_access_log, executor=executor,
                 model_nice=args.model_nice)


def _devices(text: str | None) -> list[int] | None:
    """``--devices 0,1`` as GPU ids (None without the flag); refused by name when an entry is not
    an id of 0 or more, or when it names none."""
    if text is None:
        return None
    try:
        devices = [int(d) for d in text.split(",") if d.strip()]
    except ValueError:
        devices = []
    if not devices or min(devices) < 0:
        raise ValueError(f"--devices must be GPU ids of 0 or more separated by commas (0,1), got {text!r}")
    return devices
