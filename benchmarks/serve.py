"""``uform serve`` under load, judged by its own CPU cost and by ratios (the clients share its cores).

    python benchmarks/serve.py [--seconds 4] [--clients 1,8,32,128] [--client wrk|asyncio]
        [--server-args '--batches-at-once 2 --threads 1'] [--texts-only] [--guard-rounds N]

In-process first (the default model): ``text_encode`` of one short text (p50 latency of a
single call, texts/s) and of 64 at once (texts/s and process CPU seconds per text), the same 64
as ``uform serve --threads 1 --batches-at-once <cores>`` runs calls on CPUs (one ONNX Runtime
thread a call, one call a core at once; the server's default until 2026-12-01), and
``image_encode`` of one 640x480 JPEG. Then a ``uform serve`` subprocess driven over loopback
by a load generator (``wrk`` with one thread where installed, else a lean asyncio client in a
process of its own), one text or one 640x480 JPEG (a data: URL) per request, at each client
count: requests/s, p50 and p99 latency, the server process's CPU seconds per request (from
/proc; its event loop's thread alone too), text_encode's mean batch, and the CPU shares of the
server, the generator and everything else running on the machine; the server's resident memory across 10,000
requests of distinct texts (after the text points, before the images). Then the same server (``--server-args`` too) with batching off (one verb call per request),
alone and then in turns with the batching one (``--paired-rounds`` rounds at 32 clients, the in-process 64 texts between
the two servers' points of a round: the machine's speed drifts from minute to minute, and a ratio of two points measured
minutes apart carries that drift; each round's ratios, throughput and CPU, are of figures taken within seconds), and, for the choice of framework and server, a bare JSON echo route: a plain ASGI callable (what
``uform serve`` runs: an application of its own, no framework), Starlette and FastAPI on uvicorn,
and the plain callable on granian where installed. Writes benchmarks/results/serve.json.

``--guard-rounds N`` (with ``--texts-only``: it writes benchmarks/results/serve-guard.json): what
the guard in front of uvicorn costs (uform.serve.guard: heads and URLs bounded, 431/414), N
rounds at 32 clients of ``uform serve`` as it runs and of the same server with uvicorn's
httptools protocol alone (the guard left out by replacing ``uform.serve.run._protocol`` in
that process: no option of the command turns it off), in turns, the in-process 64 texts
between the two: each round's requests/s, server CPU a request (all, and the event loop's),
and each over the in-process CPU a text.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import importlib.util
import io
import json
import os
import resource
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import save, table  # noqa: E402

TEXT = "a red circle moving up"
BATCH64 = [f"{TEXT} {i}" for i in range(64)]
TICK = os.sysconf("SC_CLK_TCK")


def photo_jpeg() -> bytes:
    """A 640x480 photo-like JPEG (smooth gradients plus noise), quality 90."""
    from PIL import Image

    y, x = np.mgrid[0:480, 0:640]
    rng = np.random.default_rng(0)
    rgb = np.stack([128 + 100 * np.sin(x / 60), 128 + 100 * np.cos(y / 45), 255 * x / 640], -1) + rng.integers(-12, 12, (480, 640, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def in_process(seconds: float, jpeg: bytes) -> dict[str, Any]:
    import uform

    with uform.Model.load_ram() as model:
        arena = uform.Arena()
        latencies: list[float] = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end or len(latencies) < 50:
            t = time.perf_counter()
            model.text_encode([TEXT], arena)
            latencies.append(time.perf_counter() - t)
        texts_per_s, cpu_per_text = batch64(model, arena, seconds)
        images: list[float] = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end or len(images) < 10:
            t = time.perf_counter()
            model.image_encode([jpeg], arena)
            images.append(time.perf_counter() - t)
        d, backend, compute = model.describe(), model.backend, model.compute
    side = side_by_side(seconds, BATCH64)
    return {
            "cpu_class": d.cpu_class.value if d.cpu_class else None, "backend": backend, "compute": compute,
            "text_p50_ms": round(float(np.median(latencies)) * 1000, 3), "text_texts_per_s_batch1": round(len(latencies) / sum(latencies), 1),
            "text_texts_per_s_batch64": round(texts_per_s, 1), "text_cpu_ms_per_text_batch64": round(cpu_per_text * 1000, 4),
            "image_p50_ms": round(float(np.median(images)) * 1000, 3), **side,
    }  # fmt: skip


def batch64(model: Any, arena: Any, seconds: float) -> tuple[float, float]:
    """``text_encode`` of 64 texts at once for ``seconds`` (5 calls at least): texts/s and
    process CPU seconds a text."""
    calls, cpu, wall = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - wall < seconds or calls < 5:
        model.text_encode(BATCH64, arena)
        calls += 1
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return calls * len(BATCH64) / wall, cpu / (calls * len(BATCH64))


def side_by_side(seconds: float, batch: list[str]) -> dict[str, Any]:
    """``text_encode`` of ``batch`` as ``uform serve --threads 1 --batches-at-once <cores>`` runs
    it: one ONNX Runtime thread a call, as many calls at once as there are cores; texts/s and
    process CPU seconds a text."""
    import threading

    import uform
    from uform.core.executor import available_cores

    cores = available_cores()
    with uform.Executor(1) as executor, uform.Model.load_ram(executor=executor) as model:
        counts = [0] * cores
        start = threading.Barrier(cores + 1)

        def run(k: int) -> None:
            arena = uform.Arena()
            model.text_encode(batch, arena)
            start.wait()
            while time.perf_counter() < stop or counts[k] < 5:
                model.text_encode(batch, arena)
                counts[k] += 1

        threads = [threading.Thread(target=run, args=(k,)) for k in range(cores)]
        stop = float("inf")
        for t in threads:
            t.start()
        stop = time.perf_counter() + seconds
        start.wait()
        cpu, wall = time.process_time(), time.perf_counter()
        for t in threads:
            t.join()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    texts = sum(counts) * len(batch)
    return {"text_texts_per_s_batch64_side_by_side": round(texts / wall, 1), "text_cpu_ms_per_text_batch64_side_by_side": round(cpu / texts * 1000, 4),
            "side_by_side_calls": cores}  # fmt: skip


class Served:
    """A ``uform serve`` (or bare app) subprocess on a free port: ``args`` after the Python
    executable, told ``--port 0``, which prints ``listening on URL`` on stderr; or, with
    ``port``, any command listening on that port (granian), ready once it accepts."""

    def __init__(self, args: list[str], port: int | None = None) -> None:
        if port is not None:
            self.proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    return
                except OSError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"{args[:3]} did not listen on port {port}") from None
                    time.sleep(0.05)
        self.proc = subprocess.Popen([sys.executable, *args, "--port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if "listening on " in line:
                self.url = line.split("listening on ", 1)[1].split()[0]
                break
        else:
            raise RuntimeError(f"the server exited with {self.proc.wait()} before listening")

    def cpu(self) -> float:
        """CPU seconds of the server process, every thread, and of the processes it started (granian's workers)."""
        total, parents = 0, {self.proc.pid}
        stats = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stats[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
        while parents:
            pid = parents.pop()
            fields = stats.get(pid)
            if fields is None:
                continue
            total += int(fields[11]) + int(fields[12])  # utime + stime, every thread
            parents |= {child for child, f in stats.items() if int(f[1]) == pid}
        return total / TICK

    def loop_cpu(self) -> float:
        """CPU seconds of the main thread alone (the event loop: HTTP, JSON, batching)."""
        fields = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK

    def batches(self) -> tuple[float, float]:
        """``(items, calls)`` of text_encode so far, from /metrics; zeros where there is none."""
        import urllib.request

        try:
            text = urllib.request.urlopen(self.url + "/metrics", timeout=10).read().decode()
        except OSError:
            return 0.0, 0.0
        found = {line.split("{")[0]: float(line.split()[-1]) for line in text.splitlines() if line.startswith(("uform_batch_items_sum{verb=\"text_encode\"}", "uform_batch_items_count{verb=\"text_encode\"}"))}
        return found.get("uform_batch_items_sum", 0.0), found.get("uform_batch_items_count", 0.0)

    def rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def machine_cpu() -> float:
    """CPU seconds every process on the machine has used (user, nice, system, irq, softirq, steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _ms(text: str) -> float:
    for unit, scale in (("us", 0.001), ("ms", 1.0), ("s", 1000.0), ("m", 60000.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return float(text)


def drive_wrk(url: str, body: bytes, clients: int, seconds: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = {json.dumps(body.decode())}\n')
    before = children_cpu()
    out = subprocess.run(["wrk", "-t1", f"-c{clients}", f"-d{max(1, round(seconds))}s", "--latency", "-s", script.name, url + "/v1/embeddings"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    os.unlink(script.name)
    found: dict[str, Any] = {"client_cpu_s": children_cpu() - before, "errors": 0}
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["Requests/sec:"]:
            found["rps"] = float(words[1])
        elif words[:1] in (["50%"], ["99%"]):
            found["p" + words[0][:-1] + "_ms"] = _ms(words[1])
        elif "requests in" in line:
            found["requests"] = int(words[0])
        elif line.strip().startswith("Non-2xx"):
            found["errors"] += int(words[-1])
        elif line.strip().startswith("Socket errors"):
            found["errors"] += sum(int(w.strip(",")) for w in words[3::2])
    return found


async def _drive(url: str, bodies: list[bytes], clients: int, seconds: float, count: int) -> dict[str, Any]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    latencies: list[float] = []
    errors, sent = 0, 0
    end = time.perf_counter() + seconds

    async def one() -> None:
        nonlocal errors, sent
        reader, writer = await asyncio.open_connection(host, int(port))
        while (time.perf_counter() < end) if count == 0 else sent < count:
            body = bodies[sent % len(bodies)]
            sent += 1
            t = time.perf_counter()
            writer.write(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            status = int((await reader.readline()).split()[1])
            length = 0
            while (line := await reader.readline()) != b"\r\n":
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - t)
            errors += status != 200
        writer.close()

    began = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    wall = time.perf_counter() - began
    ms = np.array(latencies) * 1000
    return {"rps": len(ms) / wall, "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "requests": len(ms), "errors": errors}


def drive(kind: str, url: str, body: bytes, clients: int, seconds: float) -> dict[str, Any]:
    if kind == "wrk":
        return drive_wrk(url, body, clients, seconds)
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write(body)
    before = children_cpu()
    out = subprocess.run([sys.executable, __file__, "--drive", url, "--body", f.name, "--clients", str(clients), "--seconds", str(seconds)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    os.unlink(f.name)
    found: dict[str, Any] = json.loads(out)
    return found | {"client_cpu_s": children_cpu() - before}


def measured(server: Served, kind: str, body: bytes, clients: int, seconds: float) -> dict[str, Any]:
    """One point: the generator's figures, the server's CPU a request (all of it, and its event
    loop's thread alone), text_encode's mean batch, and the CPU shares (of every core) of the
    server, the generator and everything else on the machine (other people's work)."""
    items, calls = server.batches()
    machine, loop, cpu, wall = machine_cpu(), server.loop_cpu(), server.cpu(), time.perf_counter()
    got = drive(kind, server.url, body, clients, seconds)
    cpu, wall, loop, machine = server.cpu() - cpu, time.perf_counter() - wall, server.loop_cpu() - loop, machine_cpu() - machine
    items, calls = (a - b for a, b in zip(server.batches(), (items, calls)))
    cores, n = os.cpu_count() or 1, max(got["requests"], 1)
    return {
        "clients": clients, "rps": round(got["rps"], 1), "p50_ms": round(got["p50_ms"], 3), "p99_ms": round(got["p99_ms"], 3),
        "requests": got["requests"], "errors": got["errors"], "server_cpu_ms_per_request": round(cpu / n * 1000, 4),
        "server_loop_cpu_ms_per_request": round(loop / n * 1000, 4), "text_batch_mean": round(items / calls, 1) if calls else None,
        "server_cpu_share": round(cpu / wall / cores, 3), "client_cpu_share": round(got["client_cpu_s"] / wall / cores, 3),
        "other_cpu_share": round(max(machine - cpu - got["client_cpu_s"], 0.0) / wall / cores, 3),
    }  # fmt: skip


def memory(server: Served, requests: int, clients: int) -> dict[str, Any]:
    """Resident memory after each tenth of ``requests`` requests of distinct texts."""
    step = max(requests // 10, 1)
    samples = []
    for k in range(10):
        bodies = [json.dumps({"input": f"{TEXT} number {k * step + i}"}).encode() for i in range(step)]
        asyncio.run(_drive(server.url, bodies, clients, 0, step))
        samples.append(server.rss())
    base = samples[0]
    return {"requests": step * 10, "rss_mib": [round(s / 2**20, 2) for s in samples],
            "max_change_vs_first_tenth": round(max(abs(s - base) for s in samples) / base, 4),
            "last_vs_first_tenth": round((samples[-1] - base) / base, 4)}  # fmt: skip


UNGUARDED = """
import sys
import uform.serve.run as run
run._protocol = lambda config, connections, refused=None: "httptools"  # uvicorn's own protocol, no guard
from uform.cli import main
sys.exit(main(["serve", *sys.argv[1:]]))
"""


def in_turns(x: Served, y: Served, kind: str, body: bytes, clients: int, seconds: float, rounds: int) -> Iterator[tuple[int, tuple[dict[str, Any], dict[str, Any]], float]]:
    """``rounds`` rounds of one point on two servers in turns (which goes first alternates), the
    in-process ``text_encode`` of 64 texts between them (both servers idle): each round's number,
    the two servers' figures (x's, y's) and the in-process CPU seconds a text."""
    import uform

    with uform.Model.load_ram() as model:
        arena = uform.Arena()
        batch64(model, arena, 0.2)  # warm-up
        for r in range(rounds):
            first, second = (x, y) if r % 2 == 0 else (y, x)
            got = {id(first): measured(first, kind, body, clients, seconds)}
            _, cpu_per_text = batch64(model, arena, min(seconds, 2.0))
            got[id(second)] = measured(second, kind, body, clients, seconds)
            yield r, (got[id(x)], got[id(y)]), cpu_per_text


def guard_rounds(guarded: Served, bare: Served, kind: str, body: bytes, clients: int, seconds: float, rounds: int) -> dict[str, Any]:
    """``rounds`` rounds of one point on the server with its guard and without it, in turns
    (which goes first alternates), the in-process 64 texts between; each round's figures and
    the medians of their ratios."""
    out = []
    for r, (guard, no_guard), cpu_per_text in in_turns(guarded, bare, kind, body, clients, seconds, rounds):
        row: dict[str, Any] = {"round": r, "in_process_cpu_ms_per_text_batch64": round(cpu_per_text * 1000, 4)}
        for name, g in (("guard", guard), ("no_guard", no_guard)):
            row |= {f"{name}_{k}": g[k] for k in ("rps", "server_cpu_ms_per_request", "server_loop_cpu_ms_per_request", "text_batch_mean", "errors", "other_cpu_share")}
            row[f"{name}_vs_in_process_batch64"] = round(g["server_cpu_ms_per_request"] / (cpu_per_text * 1000), 3)
        out.append(row)
        print(json.dumps(row), flush=True)
    median = {k: round(float(np.median([row[k] for row in out])), 4) for k in out[0] if k != "round"}
    ratios = {"rps_guard_over_no_guard": round(float(np.median([r["guard_rps"] / r["no_guard_rps"] for r in out])), 3),
              "cpu_guard_over_no_guard": round(float(np.median([r["guard_server_cpu_ms_per_request"] / r["no_guard_server_cpu_ms_per_request"] for r in out])), 3),
              "loop_cpu_guard_over_no_guard": round(float(np.median([r["guard_server_loop_cpu_ms_per_request"] / r["no_guard_server_loop_cpu_ms_per_request"] for r in out])), 3)}  # fmt: skip
    return {"clients": clients, "seconds": seconds, "rounds": out, "medians": median, "median_ratios": ratios}


def paired(on: Served, off: Served, kind: str, body: bytes, clients: int, seconds: float, rounds: int) -> list[dict[str, Any]]:
    """``rounds`` rounds of one point on each server, in turns (which goes first alternates),
    and between them the in-process ``text_encode`` of 64 texts (both servers idle): each
    round's requests/s and server CPU a request, their ratios (batching on / off), and the
    batching server's CPU a request over the in-process CPU a text of the same round."""
    out = []
    for _, (a, b), cpu_per_text in in_turns(on, off, kind, body, clients, seconds, rounds):
        out.append({"clients": clients, "rps": a["rps"], "rps_batching_off": b["rps"], "throughput_ratio": round(a["rps"] / b["rps"], 3),
                    "server_cpu_ms_per_request": a["server_cpu_ms_per_request"], "server_cpu_ms_per_request_batching_off": b["server_cpu_ms_per_request"],
                    "in_process_cpu_ms_per_text_batch64": round(cpu_per_text * 1000, 4),
                    "server_cpu_vs_in_process_batch64": round(a["server_cpu_ms_per_request"] / (cpu_per_text * 1000), 3)})  # fmt: skip
    return out


async def asgi_echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The JSON echo route as a plain ASGI callable, no framework (as ``uform serve``'s own
    application is): what the server alone costs a request."""
    if scope["type"] != "http":
        return
    message = await receive()
    doc = json.loads(message.get("body", b""))
    body = json.dumps({"object": "list", "data": [{"index": 0, "embedding": [0.5] * 64}], "n": len(doc)}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def bare_app(framework: str) -> Any:
    """A JSON echo route: what the framework costs a request before any model work."""
    if framework == "asgi":
        return asgi_echo
    if framework == "fastapi":
        import fastapi
        from fastapi.responses import Response as FastAPIResponse

        app = fastapi.FastAPI()
        globals()["FastAPIRequest"] = fastapi.Request  # the endpoint's annotation, resolved by name

        async def echo_fastapi(request: FastAPIRequest) -> FastAPIResponse:  # type: ignore[name-defined]  # noqa: F821
            doc = json.loads(await request.body())
            return FastAPIResponse(json.dumps({"object": "list", "data": [{"index": 0, "embedding": [0.5] * 64}], "n": len(doc)}), media_type="application/json")

        app.post("/v1/embeddings")(echo_fastapi)
        return app
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def echo(request: Request) -> Response:
        doc = json.loads(await request.body())
        return Response(json.dumps({"object": "list", "data": [{"index": 0, "embedding": [0.5] * 64}], "n": len(doc)}), media_type="application/json")

    return Starlette(routes=[Route("/v1/embeddings", echo, methods=["POST"])])


def run_bare(framework: str, port: int) -> None:
    """The echo route on uvicorn (its native parser and loop), on a socket bound here so that
    the line naming the port comes before any request."""
    import uvicorn

    sock = socket.create_server(("127.0.0.1", port))
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", file=sys.stderr, flush=True)
    config = uvicorn.Config(bare_app(framework), access_log=True, log_level="info", http="httptools", loop="uvloop")
    uvicorn.Server(config).run(sockets=[sock])


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port: int = sock.getsockname()[1]
        return port


def bare_servers() -> list[tuple[str, str, list[str], int | None]]:
    """``(framework, server, Served args, port)`` of each bare echo installed here: the plain
    ASGI callable, Starlette and FastAPI on uvicorn, and the plain callable on granian (one
    worker, one runtime thread), the other ASGI server weighed for ``uform serve``."""
    out: list[tuple[str, str, list[str], int | None]] = []
    for framework in ("asgi", "starlette", "fastapi"):
        if framework == "asgi" or importlib.util.find_spec(framework) is not None:
            out.append((framework, "uvicorn", [__file__, "--bare", framework], None))
    if importlib.util.find_spec("granian") is not None:
        port = free_port()
        args = ["-m", "granian", "--interface", "asgi", "--workers", "1", "--runtime-threads", "1", "--no-ws", "--log-level", "warning",
                "--port", str(port), "--working-dir", str(Path(__file__).parent), "serve:asgi_echo"]  # fmt: skip
        out.append(("asgi", "granian", args, port))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=4.0, help="seconds of load at each point (default 4)")
    p.add_argument("--clients", default="1,8,32,128")
    p.add_argument("--client", choices=["wrk", "asyncio"], default="wrk" if shutil.which("wrk") else "asyncio")
    p.add_argument("--memory-requests", type=int, default=10000)
    p.add_argument("--server-args", default="", help="more uform serve options for the batching server (e.g. '--batches-at-once 2 --threads 1')")
    p.add_argument("--paired-rounds", type=int, default=4, help="rounds of the batching server and the batching-off one in turns (default 4)")
    p.add_argument("--texts-only", action="store_true", help="in-process figures and the text points alone (no images, memory, baselines)")
    p.add_argument("--guard-rounds", type=int, default=0, help="with --texts-only: rounds of the server with and without its guard in turns, at 32 clients")
    p.add_argument("--drive", help=argparse.SUPPRESS)
    p.add_argument("--body", help=argparse.SUPPRESS)
    p.add_argument("--bare", choices=["asgi", "starlette", "fastapi"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.drive:  # the asyncio load generator, in a process of its own
        print(json.dumps(asyncio.run(_drive(a.drive, [Path(a.body).read_bytes()], int(a.clients), a.seconds, 0))))
        return
    if a.bare:
        run_bare(a.bare, a.port)
        return
    clients = [int(c) for c in a.clients.split(",")]
    print(f"load generator: {'wrk -t1' if a.client == 'wrk' else 'the asyncio client (wrk is not installed)' if not shutil.which('wrk') else 'the asyncio client'}", flush=True)
    jpeg = photo_jpeg()
    text_body = json.dumps({"input": TEXT, "model": "default", "encoding_format": "base64"}).encode()  # as the openai client asks
    float_body = json.dumps({"input": TEXT, "model": "default", "encoding_format": "float"}).encode()
    image_body = json.dumps({"input": [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()}}]}).encode()
    result: dict[str, Any] = {"load_generator": "wrk -t1 (one thread)" if a.client == "wrk" else "asyncio client (one process)",
                              "cores": os.cpu_count(), "seconds_per_point": a.seconds}  # fmt: skip
    result["in_process"] = inproc = in_process(min(a.seconds, 2.0), jpeg)
    print(json.dumps(inproc, indent=1))
    serve_cmd = ["-m", "uform.cli", "serve"]
    result["server_args"] = a.server_args
    server = Served([*serve_cmd, *shlex.split(a.server_args)])
    try:
        measured(server, a.client, text_body, 8, min(a.seconds, 1))  # warm-up
        result["texts"] = [measured(server, a.client, text_body, c, a.seconds) for c in clients]
        print(table(result["texts"], list(result["texts"][0])))
        if a.texts_only:
            at = {row["clients"]: row for row in result["texts"]}
            key = 32 if 32 in at else max(at)
            ratio = at[key]["server_cpu_ms_per_request"] / inproc["text_cpu_ms_per_text_batch64"]
            print(json.dumps({"clients": key, "server_cpu_per_text_vs_in_process_batch64": round(ratio, 2)}))
            if a.guard_rounds:
                bare = Served(["-c", UNGUARDED, *shlex.split(a.server_args)])
                try:
                    measured(bare, a.client, text_body, 8, min(a.seconds, 1))
                    result["guard"] = guard_rounds(server, bare, a.client, text_body, 32, a.seconds, a.guard_rounds)
                finally:
                    bare.close()
                print(json.dumps({k: result["guard"][k] for k in ("medians", "median_ratios")}, indent=1))
                print(f"wrote {save('serve-guard', result)}")
            return
        # memory before the images: what 640x480 batches' buffers leave is handed back by the
        # allocator at its own pace, which read as a fall of up to 11 % after the first tenth
        result["memory"] = memory(server, a.memory_requests, 32)
        print(result["memory"])
        result["texts_float"] = [measured(server, a.client, float_body, c, a.seconds) for c in clients if c >= 32][:1]
        measured(server, a.client, image_body, 8, min(a.seconds, 1))
        result["images_640x480_jpeg"] = [measured(server, a.client, image_body, c, a.seconds) for c in clients]
        print(table(result["images_640x480_jpeg"], list(result["images_640x480_jpeg"][0])))
        off = Served([*serve_cmd, *shlex.split(a.server_args), "--no-batching"])  # the same server, batching off
        try:
            measured(off, a.client, text_body, 8, min(a.seconds, 1))
            result["texts_batching_off"] = [measured(off, a.client, text_body, c, a.seconds) for c in clients if c >= 32][:1]
            if result["texts_batching_off"]:  # both servers in turns, so that the machine's drift falls on both alike
                key = result["texts_batching_off"][0]["clients"]
                result["paired_rounds"] = paired(server, off, a.client, text_body, key, a.seconds, a.paired_rounds)
        finally:
            off.close()
    finally:
        server.close()
    result["frameworks"] = []
    for framework, server_name, args, port in bare_servers():
        bare = Served(args, port)
        try:
            measured(bare, a.client, text_body, 8, min(a.seconds, 1))
            result["frameworks"].append({"framework": framework, "server": server_name, **measured(bare, a.client, text_body, 32, a.seconds)})
        finally:
            bare.close()
    print(table(result["frameworks"], ["framework", "server", "rps", "server_cpu_ms_per_request"]))
    result["goals"] = goals(result)
    print(json.dumps(result["goals"], indent=1))
    print(f"wrote {save('serve', result)}")


def goals(r: dict[str, Any]) -> dict[str, Any]:
    at = {row["clients"]: row for row in r["texts"]}
    key = 32 if 32 in at else max(at)
    off = r["texts_batching_off"][0] if r["texts_batching_off"] else None
    paired = r.get("paired_rounds") or []
    cpu_ratio = at[key]["server_cpu_ms_per_request"] / r["in_process"]["text_cpu_ms_per_text_batch64"]
    one = at.get(1)
    return {
        "clients": key,
        "server_cpu_per_text_vs_in_process_batch64": round(cpu_ratio, 2), "server_cpu_goal_met": cpu_ratio <= 1.5,
        "server_cpu_per_text_vs_in_process_batch64_side_by_side": round(at[key]["server_cpu_ms_per_request"] / r["in_process"]["text_cpu_ms_per_text_batch64_side_by_side"], 2),
        "throughput_vs_batching_off": round(at[key]["rps"] / off["rps"], 2) if off else None,
        "throughput_goal_met": bool(off and at[key]["rps"] >= 3 * off["rps"]),
        "throughput_vs_batching_off_paired_median": round(float(np.median([p["throughput_ratio"] for p in paired])), 2) if paired else None,
        "throughput_goal_met_paired": bool(paired and np.median([p["throughput_ratio"] for p in paired]) >= 3),
        "server_cpu_vs_in_process_batch64_paired_median": round(float(np.median([p["server_cpu_vs_in_process_batch64"] for p in paired])), 2) if paired else None,
        "server_cpu_goal_met_paired": bool(paired and np.median([p["server_cpu_vs_in_process_batch64"] for p in paired]) <= 1.5),
        "one_client_p50_minus_in_process_ms": round(one["p50_ms"] - r["in_process"]["text_p50_ms"], 3) if one else None,
        "latency_goal_met": bool(one and one["p50_ms"] <= r["in_process"]["text_p50_ms"] + 2),
        "memory_change": r["memory"]["max_change_vs_first_tenth"], "memory_goal_met": r["memory"]["max_change_vs_first_tenth"] <= 0.05,
    }  # fmt: skip


if __name__ == "__main__":
    main()
