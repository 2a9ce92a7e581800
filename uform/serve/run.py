"""``uform serve``: load the model, run the application on uvicorn, drain on SIGTERM.

On SIGTERM (or Ctrl-C) the server stops accepting connections, answers ``/health`` with 503,
answers every request in flight within ``--drain-seconds`` and exits 0.

uvicorn is driven through its public interface alone: ``uvicorn.Config`` (uvloop, no
websockets; as its ``http`` protocol the guard of :mod:`uform.serve.guard`, which bounds
request heads and hands every byte to uvicorn's httptools protocol through
``asyncio.Protocol``'s methods), the listening socket bound here and handed to
``uvicorn.Server.run(sockets=...)`` (so that the line saying where it listens names the port
``--port 0`` picked, printed once the application has started), and ``handle_exit``
overridden to mark the server draining before uvicorn's own shutdown and to have the guard
close, when ``--drain-seconds`` run out, every connection still open (its request then ends
as a client that left: no 500, no traceback; uvicorn waits a second longer before it would
cancel anything).

On CPUs the model is loaded with the library's own threading by default (``threads`` None:
every core's ONNX Runtime thread in each call), and each lane runs one batch at a time
(``ServeConfig.batches_at_once`` 1): under load a lane's one call takes everything queued and
runs it on every core, which answered more texts a second at 32 clients than one call a core
side by side (whose batches clumped on one call while the other core idled;
docs/notes/serving-history.md).

While batching, the interpreter's switch interval is ``SWITCH_INTERVAL`` (0.2 ms, Python's
default is 5 ms): a lane's thread that needs the interpreter lock between its ONNX Runtime
runs waits at most that long for the event loop to hand it over, so the model waits less on
the loop; with batching off (16 calls' threads) the default interval is kept, which answered
more there (docs/notes/serving-history.md).

The threads that run the model (ONNX Runtime's, the lanes', and what they start) run at a
nice value ``MODEL_NICE`` (10) above the event loop's: where the loop and a verb call want the
same core, the loop runs first (answering, parsing, queueing the next batch) and the call
takes the time it leaves: at 32 clients on 2 cores 1.06x the requests a second at 0.91x the
CPU a request (interleaved rounds, every one ahead; docs/notes/serving-history.md). It is set with
batching on and off alike. On a machine shared with other work the model's threads give way
to that work too.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from .config import ServeConfig
from .guard import Connections, Refusals, guarded

if TYPE_CHECKING:
    from uform import Executor, Model

SWITCH_INTERVAL = 0.0002  # seconds, while batching (sys.setswitchinterval)
MODEL_NICE = 10  # added to the nice value of every thread but the event loop's (ServeConfig.model_nice)


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
          executor: Executor | None = None, model_nice: int = MODEL_NICE) -> int:  # fmt: skip
    """Serve until SIGTERM or SIGINT, then drain; answers the exit status (0). ``executor``, the
    one ``model`` was loaded with, is closed after it. Every thread of the process but this one
    (the event loop's) gets ``model_nice`` added to its nice value, and so do the lanes'
    threads as they start (``ServeConfig.model_nice``)."""
    if not 0 <= port <= 65535:  # getaddrinfo takes a port modulo 65536 (70000: 4464), before anything changes
        raise ValueError(f"port must be 0-65535 (0 picks a free one), got {port}")
    import dataclasses
    import threading

    import uvicorn

    from .routes import create_app
    from .asgi import AccessLog
    from .lane import lower_priority

    config = dataclasses.replace(config, model_nice=model_nice)
    # the threads made so far are ONNX Runtime's (and uvloop's); the lanes' lower their own as they start
    sock = _listen(host, port)  # bound here (before anything changes), so that the line below names the port 0 picked
    loop_thread = threading.get_native_id()
    lower_priority([t for t in _threads() if t != loop_thread], config.model_nice)
    bound = sock.getsockname()
    where = f"http://{'[' + bound[0] + ']' if ':' in bound[0] else bound[0]}:{bound[1]}"
    line = f"uform serve: listening on {where} (model {config.model_id!r}: {', '.join(model.served.modalities)})"
    app, state = create_app(model, config, AccessLog() if access_log else None, lambda: print(line, file=announce or sys.stderr, flush=True))
    connections = Connections(limit=config.max_connections, head_seconds=config.header_seconds, body_seconds=config.body_seconds,
                              send_seconds=config.send_seconds)
    http = _protocol(config, connections, app.refused)
    uv = uvicorn.Config(
        app, lifespan="on", access_log=False, log_level="info",
        # uvicorn cancels what still runs a second after the guard closed its connection (which ends it)
        timeout_graceful_shutdown=math.ceil(config.drain_seconds) + 1,
        http=http, loop=_loop(), ws="none", timeout_keep_alive=config.keep_alive_seconds,
        proxy_headers=False,  # the access log names the connection's peer; X-Forwarded-For is not read
    )  # fmt: skip

    class Draining(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not state.draining:  # the first signal: the drain's deadline closes what is still open
                state.drain_ends = time.monotonic() + config.drain_seconds
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:  # not serving yet: nothing to close
                    pass
                else:
                    loop.call_soon_threadsafe(loop.call_later, config.drain_seconds, connections.close_all)
            state.draining = True
            super().handle_exit(sig, frame)

    # uvicorn raises the signal it caught again once it has stopped; a handler of our own
    # makes that a no-op, so that a drained server exits 0 instead of dying of SIGTERM, or of
    # SIGINT as a KeyboardInterrupt (exit status 130, 'uform: interrupted', after a whole drain)
    previous = {sig: signal.signal(sig, _ignore) for sig in (signal.SIGTERM, signal.SIGINT)}
    interval = sys.getswitchinterval()
    if config.batching:
        sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        Draining(uv).run(sockets=[sock])
    finally:
        sys.setswitchinterval(interval)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
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


def _threads() -> list[int]:
    """The ids of this process's threads (none where /proc is not there)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


def _ignore(sig: int, frame: FrameType | None) -> None:
    return None


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host`` and ``port`` (0: a free one), as uvicorn binds its own."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: the host does not resolve ({exc.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def _protocol(config: ServeConfig, connections: Connections, refused: Refusals | None = None) -> type[asyncio.Protocol]:
    """uvicorn's ``http``: the guard (serve.guard) in front of uvicorn's httptools protocol.
    There is no fallback to uvicorn's h11 protocol, which none of the guard's bounds would
    cover (``--max-connections``, ``--header-timeout``, ``--send-timeout``, the drain's
    deadline): without httptools, importing serve.guard (and so this module) fails, and ``uform
    serve`` refuses to start, naming the serve extra."""
    from uvicorn.config import HTTP_PROTOCOLS
    from uvicorn.importer import import_from_string

    inner = import_from_string(HTTP_PROTOCOLS["httptools"])
    return guarded(inner, config.max_url_bytes, config.max_header_bytes, connections, refused, config.max_request_bytes)


def _loop() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"
