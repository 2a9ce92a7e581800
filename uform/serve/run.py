"""``uform serve``: load the model, run the application on uvicorn, drain on SIGTERM.

On SIGTERM (or Ctrl-C) the server stops accepting connections, answers ``/health`` with 503,
answers every request in flight within ``--drain-seconds`` and exits 0.

On CPUs the model is loaded with the library's own threading by default (``threads`` None:
every core's ONNX Runtime thread in each call), and each lane runs one batch at a time
(``ServeConfig.batches_at_once`` 1): under load a lane's one call takes everything queued and
runs it on every core, which answered more texts a second at 32 clients than one call a core
side by side (whose batches clumped on one call while the other core idled; docs/benchmarks.md).

While batching, the interpreter's switch interval is ``SWITCH_INTERVAL`` (0.2 ms, Python's
default is 5 ms): a lane's thread that needs the interpreter lock between its ONNX Runtime
runs waits at most that long for the event loop to hand it over, so the model waits less on
the loop; with batching off (16 calls' threads) the default interval is kept, which answered
more there (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from .config import ServeConfig

if TYPE_CHECKING:
    from uform import Executor, Model

SWITCH_INTERVAL = 0.0002  # seconds, while batching (sys.setswitchinterval)


def load(model_path: str | None, quantization: str, devices: Sequence[int] | None, threads: int | None = 1) -> tuple[Model, Executor | None]:
    """The model, and the executor it was loaded with when it is the server's to close (a CPU
    load with ``threads`` ONNX Runtime threads a call; None: the library's default)."""
    from uform import Executor, Model, Scalar

    if devices:
        return Model.load_vram(model_path, devices=list(devices), quantization=Scalar(quantization)), None
    if threads is None:
        return Model.load_ram(model_path, quantization=Scalar(quantization)), None
    executor = Executor(threads)
    return Model.load_ram(model_path, quantization=Scalar(quantization), executor=executor), executor


def serve(model: Model, config: ServeConfig, *, host: str, port: int, access_log: bool = True, announce: Any = None,
          executor: Executor | None = None) -> int:  # fmt: skip
    """Serve until SIGTERM or SIGINT, then drain; answers the exit status (0). ``executor``, the
    one ``model`` was loaded with, is closed after it."""
    import uvicorn

    from .app import create_app
    from .catalog import served

    from .http import AccessLog

    app, state = create_app(model, config, AccessLog() if access_log else None)
    uv = uvicorn.Config(
        app, host=host, port=port, lifespan="on", access_log=False, log_level="info",
        timeout_graceful_shutdown=max(1, int(config.drain_seconds)), http=_http(), loop=_loop(),
        proxy_headers=False,  # the access log names the connection's peer; X-Forwarded-For is not read
    )  # fmt: skip

    class Draining(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            state.draining = True
            super().handle_exit(sig, frame)

        def _log_started_message(self, listeners: Sequence[Any]) -> None:
            bound = listeners[0].getsockname()
            where = f"http://{'[' + bound[0] + ']' if ':' in bound[0] else bound[0]}:{bound[1]}"
            kinds = ", ".join(served(model))
            print(f"uform serve: listening on {where} (model {config.model_id!r}: {kinds})", file=announce or sys.stderr, flush=True)

    # uvicorn raises the signal it caught again once it has stopped; a handler of our own
    # makes that a no-op, so that a drained server exits 0 instead of dying of SIGTERM
    previous = signal.signal(signal.SIGTERM, _ignore)
    interval = sys.getswitchinterval()
    if config.batching:
        sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        Draining(uv).run()
    finally:
        sys.setswitchinterval(interval)
        signal.signal(signal.SIGTERM, previous)
    if state.batcher is not None and state.batcher.busy():
        # --drain-seconds ran out during a verb call, which no thread can interrupt: its
        # request was already dropped, so leave now rather than wait for the call to end
        print("uform serve: drain time ran out during a verb call; exiting without waiting for it", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(0)
    model.close()
    if executor is not None:
        executor.close()
    return 0


def _ignore(sig: int, frame: FrameType | None) -> None:
    return None


def _http() -> Any:
    """httptools with a response's writes coalesced into one (``wire``), else h11."""
    from .wire import protocol

    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return protocol() or "httptools"


def _loop() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"
