"""The figures docs/serve.md gives for ``uform serve`` under hostile clients, measured:
``python tests/test_serve_hostile.py [COUNT [same-bytes] | head | slow [ARGS] | idle [ARGS] |
chunked [ARGS]]`` runs one of these (resident memory around a request of the worst legal
pictures, a huge head, slow bodies, idle connections, chunked bodies) and prints its lines."""

from __future__ import annotations

import base64
import functools
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, cast

import httpx

import media as media_module
from serving import CHUNKED, exchange, host_port, subprocess_server


def server_memory(count: int, same_bytes: bool = False) -> str:
    """Resident memory of ``uform serve`` (the default model) around one request of ``count``
    copies of the worst legal picture: a 10000×10000 16-bit RGBA PNG (100 M pixels); with
    ``same_bytes``, a request of as many bytes whose picture is small (noise, 1 M pixels): what
    the request's own bytes cost."""
    import numpy as np
    from test_image_memory import png16_rgba

    def status(pid: int) -> dict[str, int]:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in lines) if k in ("VmRSS", "VmHWM")}

    png = png16_rgba(10000, 10000, every=10000)  # one row, repeated: 3.6 MB of file
    if same_bytes:  # 1000 rows of stored (uncompressed) RGBA noise, as many bytes
        noise = np.random.default_rng(0).integers(0, 256, (1000, len(png) // 4000, 4), dtype=np.uint8)
        png = media_module.encode_image(noise, "PNG", compress_level=0)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    with subprocess_server(["--max-request-bytes", str(max(32 << 20, count * 6 << 20))]) as server:
        small = "data:image/png;base64," + base64.b64encode(png16_rgba(64, 48)).decode()  # the image tower's first run, the threads
        assert httpx.post(server.url + "/v1/embeddings", json={"input": [{"type": "image_url", "image_url": {"url": small}}] * 4}).status_code == 200
        Path(f"/proc/{server.proc.pid}/clear_refs").write_text("5")  # its high-water mark starts again from here
        before = status(server.proc.pid)
        began = time.monotonic()
        answer = httpx.post(server.url + "/v1/embeddings", json={"input": [{"type": "image_url", "image_url": {"url": url}}] * count}, timeout=600)
        took = time.monotonic() - began
        assert answer.status_code == 200, answer.text
        after = status(server.proc.pid)
    picture = "1000x895 RGBA noise PNG" if same_bytes else "10000x10000 16-bit RGBA PNG"
    return (f"{count} x {picture} ({len(png) / 1e3:.0f} KB each): {took:.1f} s, RSS {before['VmRSS'] / 1e6:.0f} MB before, "
            f"peak {after['VmHWM'] / 1e6:.0f} MB (+{(after['VmHWM'] - before['VmRSS']) / 1e6:.0f} MB), {after['VmRSS'] / 1e6:.0f} MB after")


def rss_mb(pid: int) -> float:
    """Process ``pid``'s resident memory now, in MB."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def huge_head() -> str:
    """What a 96 MiB header costs ``uform serve`` (default limits): bytes it took, its answer, its CPU and RSS."""
    with subprocess_server([]) as server:
        pid = server.proc.pid

        def cpu() -> float:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        rss = functools.partial(rss_mb, pid)
        began, cpu0, rss0 = time.monotonic(), cpu(), rss()
        taken, raw = exchange(server.url, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"y" * (96 << 20) + b"\r\n\r\n")
        return (f"a 96 MiB header: the server took {taken / 1e6:.1f} MB of it and answered {raw.split(b' ')[1].decode()} in "
                f"{time.monotonic() - began:.2f} s, {cpu() - cpu0:.2f} s of its CPU, RSS {rss0:.0f} -> {rss():.0f} MB")


def slow_bodies(clients: int = 8, sent: int = 29 << 20, declared: int = 30 << 20, args: tuple[str, ...] = ()) -> str:
    """What ``clients`` clients cost ``uform serve`` (the default model, default limits and
    ``args``) when each sends ``sent`` bytes of a ``declared``-byte body and waits: RSS before,
    while they wait, and the answers they got."""
    with subprocess_server(list(args)) as server:
        pid = server.proc.pid
        rss = functools.partial(rss_mb, pid)
        assert httpx.post(server.url + "/v1/embeddings", json={"input": "warm up"}).status_code == 200
        before = rss()
        head = (f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n").encode()
        chunk = b'{"input": ["' + b"x" * ((1 << 20) - 12)
        socks, answers = [], []
        for _ in range(clients):
            s = socket.create_connection(host_port(server.url), timeout=30)
            s.sendall(head)
            try:
                for at in range(0, sent, 1 << 20):
                    s.sendall(chunk if at == 0 else b"x" * min(1 << 20, sent - at))
            except OSError:  # refused and closed
                pass
            socks.append(s)
        time.sleep(2)  # everything sent has been read
        held = rss()
        for s in socks:
            s.settimeout(0.5)
            try:
                got = s.recv(65536)
            except (TimeoutError, OSError):
                got = b""
            answers.append(got.split(b" ", 2)[1].decode() if got.startswith(b"HTTP/1.1 ") else "none yet")
            s.close()
        time.sleep(1)
        after = rss()
    return (f"{clients} clients each sending {sent / 2**20:.0f} MiB of a {declared / 2**20:.0f} MiB body and waiting"
            f"{' (' + ' '.join(args) + ')' if args else ''}: RSS {before:.0f} MB before, {held:.0f} MB while they wait "
            f"(+{held - before:.0f} MB), {after:.0f} MB after they closed; answers: {', '.join(answers)}")


def idle_connections(count: int = 2000, wait: float = 15, args: tuple[str, ...] = ()) -> str:
    """What ``count`` idle connections cost ``uform serve`` (the default model, default limits and
    ``args``): a third silent, a third with 60 KB of a head, a third kept alive after an answer;
    RSS before and while they are open, and how many the server closed within ``wait`` s."""
    with subprocess_server(list(args)) as server:
        pid = server.proc.pid
        rss = functools.partial(rss_mb, pid)
        assert httpx.post(server.url + "/v1/embeddings", json={"input": "warm up"}).status_code == 200
        before = rss()
        kinds: dict[str, list[socket.socket]] = {"silent": [], "part of a head": [], "kept alive": []}
        for i in range(count):
            kind, s = list(kinds)[i % 3], socket.create_connection(host_port(server.url), timeout=30)
            s.sendall(b"" if kind == "silent" else b"GET /health HTTP/1.1\r\nHost: x\r\n" + (b"X-Pad: " + b"y" * 60000 if kind != "kept alive" else b"\r\n"))
            kinds[kind].append(s)
        time.sleep(1)
        held = rss()
        time.sleep(wait)
        closed = {}
        for kind, socks in kinds.items():
            gone = 0
            for s in socks:
                s.setblocking(False)
                try:
                    while part := s.recv(1 << 20):  # an answer, then the close
                        pass
                    gone += 1
                except BlockingIOError:
                    pass
                except OSError:
                    gone += 1
                s.close()
            closed[kind] = f"{gone}/{len(socks)}"
    return (f"{count} idle connections{' (' + ' '.join(args) + ')' if args else ''}: RSS {before:.0f} MB before, {held:.0f} MB while open "
            f"(+{held - before:.0f} MB); closed by the server within {wait:g} s: " + ", ".join(f"{k} {v}" for k, v in closed.items()))


def chunked(args: tuple[str, ...] = ()) -> str:
    """A chunked body declaring one chunk of 100 GB, sent a byte a second (for up to 70 s) and as
    fast as it goes (64 MiB at most), the server's peak RSS; then 2 Mi one-byte chunks and the
    server CPU they took; then the guard's own time a 121-byte request, handed to it 200,000 times,
    and for a 32 MiB body in reads of 256 KiB."""
    head = CHUNKED + b"%x\r\n" % (100 * 10**9)
    lines = []
    with subprocess_server(list(args)) as proc:

        def peak() -> float:
            return int(re.findall(r"VmHWM:\s+(\d+)", Path(f"/proc/{proc.proc.pid}/status").read_text())[0]) / 1000

        def cpu() -> float:
            fields = Path(f"/proc/{proc.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        before = peak()
        for name, fast in (("a byte a second", False), ("as fast as it goes", True)):
            began, got = time.monotonic(), b""
            with socket.create_connection(host_port(proc.url)) as s:
                s.sendall(head)
                s.settimeout(1)
                try:
                    if fast:
                        for _ in range(64):
                            s.sendall(b"x" * (1 << 20))
                    while b"\r\n\r\n" not in got and time.monotonic() - began < 70:
                        try:
                            got += s.recv(65536)
                        except socket.timeout:
                            s.sendall(b"x")
                except OSError:
                    got += s.recv(65536) if not got else b""
            status = got.split(b"\r\n")[0].decode()
            lines.append(f"100 GB chunk, {name}: {status} after {time.monotonic() - began:.2f} s")
        lines.append(f"peak RSS {before:.0f} -> {peak():.0f} MB")
        framed = b"1\r\nx\r\n" * (2 << 20) + b"0\r\n\r\n"
        used = cpu()
        began = time.monotonic()
        with socket.create_connection(host_port(proc.url)) as s:
            try:
                s.sendall(CHUNKED[:-2] + b"Connection: close\r\n\r\n" + framed)
            except OSError:  # refused before it was sent whole (over uform.serve.chunks.MAX_CHUNKS)
                pass
            status = s.recv(65536).split(b"\r\n")[0].decode()
        lines.append(f"2 Mi one-byte chunks: {status} after {time.monotonic() - began:.2f} s, server CPU {cpu() - used:.2f} s")
    import asyncio

    from uform.serve import guard

    class Nothing(asyncio.Protocol):
        def __init__(self, **kwargs: Any) -> None:
            pass

    async def per_request() -> float:
        one = guarded_class(Nothing)()
        one.transport = cast(Any, type("T", (), {"get_extra_info": lambda self, key: None, "is_closing": lambda self: False})())
        request = b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\nContent-Length: 26\r\n\r\n"
        request += b'{"input": ["a red circle"]'
        began = time.process_time()
        for _ in range(200_000):
            one.data_received(request)
        return (time.process_time() - began) / 200_000 * 1e6

    def guarded_class(inner: type[asyncio.Protocol]) -> type[guard.Guard]:
        return guard.guarded(inner, 8192, 65536, guard.Connections(), None, 32 << 20)

    lines.append("the guard, a %d-byte request: %s us" % (121, ", ".join(f"{asyncio.run(per_request()):.2f}" for _ in range(3))))

    async def big_body() -> float:  # 32 MiB of Content-Length body in reads of 256 KiB
        one = guarded_class(Nothing)()
        one.transport = cast(Any, type("T", (), {"get_extra_info": lambda self, key: None, "is_closing": lambda self: False})())
        read = b"x" * (256 << 10)
        began = time.process_time()
        one.data_received(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (32 << 20))
        for _ in range(128):
            one.data_received(read)
        return (time.process_time() - began) * 1000

    lines.append("the guard, a 32 MiB body: %s ms" % ", ".join(f"{asyncio.run(big_body()):.2f}" for _ in range(3)))
    return "\n".join(lines)


def json_values(args: tuple[str, ...] = ()) -> str:
    """Bodies of many small JSON values (24-30 MB each), one to a fresh server: its answer, the
    seconds it took and the server's peak RSS before and after."""
    bodies = {"8 M empty strings": b'{"input": [' + b'"",' * 8_000_000 + b'""]}',
              "4 M token-id arrays": b'{"input": [' + b"[104]," * 4_000_000 + b"[104]]}",
              "3 M objects in an ignored field": b'{"input": "a", "x": [' + b'{"a":1},' * 3_000_000 + b"1]}",
              "10 M empty arrays in an ignored field": b'{"input": "a", "x": [' + b"[]," * 10_000_000 + b"1]}"}  # fmt: skip
    lines = []
    for name, body in bodies.items():
        with subprocess_server(list(args)) as proc:
            before, began = rss_peak(proc.proc.pid), time.monotonic()
            status = httpx.post(proc.url + "/v1/embeddings", content=body, timeout=120).status_code
            lines.append(f"{name} ({len(body) / 1e6:.0f} MB): {status} after {time.monotonic() - began:.2f} s, peak RSS {before:.0f} -> {rss_peak(proc.proc.pid):.0f} MB")
    return "\n".join(lines)


def rss_peak(pid: int) -> float:
    return int(re.findall(r"VmHWM:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())[0]) / 1000

