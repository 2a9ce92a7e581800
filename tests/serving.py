"""Running ``uform serve`` for the tests: a subprocess on a free port, a server on a thread of
the test process, a lean keep-alive HTTP/1.1 client over asyncio streams, and a raw socket's
exchange (``exchange``: what a server takes of a body before it refuses the rest; ``CHUNKED``: a
chunked request's head)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Proc:
    """A ``uform serve`` subprocess; ``url`` is where it listens, ``lines`` what it logged (stdout and stderr)."""

    proc: subprocess.Popen[str]
    url: str
    lines: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


@contextlib.contextmanager
def subprocess_server(args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 60) -> Iterator[Proc]:
    """Start ``uform serve --port 0 ARGS`` and wait for its 'listening on' line; kill it after."""
    cmd = [sys.executable, "-m", "uform.cli", "serve", "--port", "0", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})})
    lines: list[str] = []
    url = None
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    try:
        while url is None:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"uform serve exited ({proc.wait()}) before listening:\n" + "".join(lines))
            lines.append(line)
            if "listening on " in line:
                url = line.split("listening on ", 1)[1].split()[0]
            if time.monotonic() > deadline:
                raise TimeoutError("uform serve did not start:\n" + "".join(lines))
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
        reader.start()
        yield Proc(proc, url, lines)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(10)


@contextlib.contextmanager
def thread_server(model: Any, config: Any) -> Iterator[tuple[str, Any]]:
    """The application on uvicorn on a thread of this process, port 0: ``(url, Server state)``."""
    import uvicorn

    from uform.serve.routes import create_app

    app, state = create_app(model, config)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", access_log=False, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        server.should_exit = True
        thread.join(30)


class Conn:
    """One keep-alive HTTP/1.1 connection (the load tests' client: light on CPU)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(body)}\r\nContent-Type: application/json\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.writer.write(head.encode() + b"\r\n" + body)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        found: dict[str, str] = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            key, _, value = line.decode().partition(":")
            found[key.strip().lower()] = value.strip()
        data = await self.reader.readexactly(int(found.get("content-length", "0")))
        if found.get("connection") == "close":
            await self.close()
        return status, found, data

    async def post_json(self, path: str, doc: Any, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
        status, found, data = await self.request("POST", path, json.dumps(doc).encode(), headers)
        return status, found, json.loads(data) if data else None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def exchange(url: str, data: bytes, chunk: int = 1 << 16, first: bytes = b"") -> tuple[int, bytes]:
    """Send ``data`` a chunk at a time until the server stops taking it; answer the bytes
    it took (sent before the connection refused more) and what it answered. ``first``: a
    request sent and answered on the connection before."""
    sent = 0
    with socket.create_connection(host_port(url), timeout=10) as s:
        early = b""
        if first:
            s.sendall(first)
            while b"\r\n\r\n" not in early or not early.endswith(b"}"):
                early += s.recv(65536)
        try:
            while sent < len(data):
                s.sendall(data[sent : sent + chunk])
                sent += chunk
        except OSError:  # the server closed: the rest was never read
            pass
        got = b""
        try:
            while part := s.recv(65536):
                got += part
        except OSError:
            pass
        return min(sent, len(data)), early + got


CHUNKED = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
