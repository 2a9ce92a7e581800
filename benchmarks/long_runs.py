"""What a long run keeps: growth per call, per load, per request and per index run, after a warm-up.

    python benchmarks/long_runs.py [--parts verbs,loads,serve,index] [--calls 2000] [--loads 200]
        [--requests 20000] [--runs 50] [--quantizations f32,bf16,e4m3]

Each part repeats one thing many times on the default model and fits a line (least squares) to
what the process holds, sampled along the way: resident memory (VmRSS), glibc's heap in use
(mallinfo2: what malloc handed out and was not given back, unlike RSS not blurred by freed pages
kept), open descriptors, threads, memory mappings and the files in $TMPDIR. ``verbs``: every verb
(texts, pictures as files and as pixels, clips, recordings as files and as samples, text_choose)
and calls that fail with InputError (a bad item of each modality); with ``--model``, those the
checkpoint serves (a converted CLIP's); ``loads``: Model.load_ram then close(), the same dropped
without close() (gc.collect()), and load_ram_buffer of the file's bytes;
``serve``: a ``uform serve`` subprocess answering requests over loopback from 8 clients (a text,
a picture, text_choose, /health, a body that is not JSON, a picture that is not one, a client that
resets after sending, one that closes halfway through its body), its RSS, descriptors, threads and
mappings every 1,000; ``index``: ``uform index`` run again and again over a folder edited between
runs (a line added to a .txt and another changed, a picture renamed, one rewritten, one removed),
the index folder's bytes and files and each run's peak RSS. Writes benchmarks/results/long_runs.json.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import ctypes.util
import gc
import io
import json
import os
import random
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import save  # noqa: E402


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
if hasattr(_LIBC, "mallinfo2"):
    _LIBC.mallinfo2.restype = _MallInfo2


def held(pid: int | str = "self") -> dict[str, int]:
    """What process ``pid`` holds: rss KB, fds, threads, maps (and, for this process, heap bytes and $TMPDIR's files)."""
    rss = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS:"))
    out = {"rss_kb": rss, "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": len(os.listdir(f"/proc/{pid}/task")),
           "maps": sum(1 for _ in open(f"/proc/{pid}/maps"))}  # fmt: skip
    if pid == "self":
        gc.collect()
        if hasattr(_LIBC, "mallinfo2"):
            info = _LIBC.mallinfo2()
            out["heap_bytes"] = int(info.uordblks + info.hblkhd)
        out["tmp_files"] = len(os.listdir(tempfile.gettempdir()))
    return out


def growth(xs: list[int], rows: list[dict[str, int]]) -> dict[str, Any]:
    """Each measure's first and last value and its slope per step (least squares)."""
    out: dict[str, Any] = {}
    for key in rows[0]:
        ys = [r[key] for r in rows]
        out[key] = {"first": ys[0], "last": ys[-1], "per_step": round(float(np.polyfit(xs, ys, 1)[0]), 4)}
    return out


def repeat(fn: Callable[[], Any], steps: int, warm: int, every: int) -> dict[str, Any]:
    for _ in range(warm):
        fn()
    xs, rows = [], []
    for i in range(steps):
        fn()
        if i % every == 0 or i == steps - 1:
            xs.append(i)
            rows.append(held())
    return {"steps": steps, **growth(xs, rows)}


def line(name: str, r: dict[str, Any]) -> str:
    parts = [f"{name:28s} {r['steps']:6d}  rss {r['rss_kb']['first'] / 1024:6.1f} -> {r['rss_kb']['last'] / 1024:6.1f} MB ({r['rss_kb']['per_step']:+.3f} KB/step)"]
    if "heap_bytes" in r:
        parts.append(f"heap {r['heap_bytes']['per_step']:+.0f} B/step")
    parts.append("fds {0[last]} ({0[per_step]:+.4f}) threads {1[last]} ({1[per_step]:+.4f}) maps {2[last]} ({2[per_step]:+.4f})".format(r["fds"], r["threads"], r["maps"]))
    return "  ".join(parts)


def verbs(quantization: str, calls: int, folder: Path, checkpoint: str | None) -> dict[str, Any]:
    from uform import Arena, Model, Scalar
    from uform.core.errors import InputError

    files = {kind: sorted(str(p) for p in folder.glob(f"{kind}-*"))[:2] for kind in ("image", "video", "audio")}
    model, arena = Model.load_ram(checkpoint, quantization=Scalar[quantization.upper()]), Arena()
    pixels = np.random.default_rng(0).integers(0, 255, (96, 128, 3), np.uint8)
    samples = np.random.default_rng(0).standard_normal(16000).astype(np.float32)

    def refused(verb: Callable[..., Any], item: Any) -> Callable[[], None]:
        def call() -> None:
            try:
                verb([item], arena)
            except InputError:
                pass
            else:
                raise AssertionError(f"{verb.__name__} accepted {item!r}")

        return call

    cases: dict[str, tuple[Callable[[], Any], int]] = {
        "text_encode": (lambda: model.text_encode(["a red circle", "a blue square moving up"], arena), calls),
        "image_encode files": (lambda: model.image_encode(files["image"], arena), calls),
        "image_encode_pixels": (lambda: model.image_encode_pixels([pixels], arena), calls),
        "video_encode files": (lambda: model.video_encode(files["video"][:1], arena), max(calls // 4, 20)),
        "audio_encode files": (lambda: model.audio_encode(files["audio"], arena), calls),
        "audio_encode_samples": (lambda: model.audio_encode_samples([samples], 16000, arena), calls),
        "text_choose": (lambda: model.text_choose(["a red circle. Is it red? Answer y or n: "], "yn", arena), calls),
        "image_encode refused": (refused(model.image_encode, b"not a picture"), calls),
        "video_encode refused": (refused(model.video_encode, b"not a clip"), calls),
        "audio_encode refused": (refused(model.audio_encode, b"not a recording at all"), calls),
    }
    out = {}
    for name, (fn, steps) in cases.items():
        if name.split()[0] not in model.served.verbs:  # a converted CLIP: no audio, no text_choose
            continue
        out[name] = repeat(fn, steps, warm=min(50, steps), every=max(steps // 20, 1))
        print(line(f"{quantization} {name}", out[name]), flush=True)
    model.close()
    return out


def loads(quantization: str, count: int) -> dict[str, Any]:
    from uform import Arena, Model, Scalar, default_checkpoint

    q, arena, data = Scalar[quantization.upper()], Arena(), default_checkpoint().read_bytes()

    def closed() -> None:
        with Model.load_ram(quantization=q) as model:
            model.text_encode(["a red circle"], arena)

    def dropped() -> None:
        model = Model.load_ram(quantization=q)
        model.text_encode(["a red circle"], arena)
        del model

    def from_bytes() -> None:
        with Model.load_ram_buffer(data, quantization=q) as model:
            model.text_encode(["a red circle"], arena)

    out = {}
    for name, fn in {"load_ram + close": closed, "load_ram dropped": dropped, "load_ram_buffer + close": from_bytes}.items():
        out[name] = repeat(fn, count, warm=10, every=max(count // 20, 1))
        print(line(f"{quantization} {name}", out[name]), flush=True)
    return out


def _request(body: bytes, path: str = "/v1/embeddings", method: str = "POST") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def _status(sock: socket.socket) -> int | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")), 0)
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(head.split()[1])


def serve(requests: int) -> dict[str, Any]:
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (32, 32), (255, 0, 0)).save(png, "PNG")
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()}}
    kinds = ["text", "picture", "choose", "health", "not json", "not a picture", "reset", "half a body"]
    fixed = {
        "picture": _request(json.dumps({"input": [picture]}).encode()),
        "choose": _request(json.dumps({"input": ["a red circle. Is it red? Answer y or n: "], "choices": "yn"}).encode(), "/v1/choose"),
        "health": _request(b"", "/health", "GET"),
        "not json": _request(b'{"input": ['),
        "not a picture": _request(json.dumps({"input": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}).encode()),
    }
    answered: dict[str, int] = {}
    lock = threading.Lock()
    proc = subprocess.Popen([sys.executable, "-m", "uform.cli", "serve", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    port = 0
    while not port:
        text = proc.stdout.readline()
        if not text:
            raise RuntimeError(f"uform serve exited ({proc.wait()}) before listening")
        if "listening on " in text:
            port = int(text.split("listening on ", 1)[1].split()[0].rsplit(":", 1)[1])
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]

    def client(first: int, last: int, step: int) -> None:
        sock: socket.socket | None = None
        for i in range(first, last, step):
            kind = kinds[i % len(kinds)]
            sock = sock or socket.create_connection(("127.0.0.1", port))
            status: int | str | None
            if kind in ("reset", "half a body"):
                whole = _request(json.dumps({"input": [f"a red circle {i}" + " x" * 400]}).encode())
                if kind == "reset":
                    sock.sendall(whole)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                else:
                    sock.sendall(whole[: len(whole) // 2])
                sock.close()
                sock, status = None, kind
            else:
                sock.sendall(fixed.get(kind) or _request(json.dumps({"input": [f"a red circle {i}"]}).encode()))
                status = _status(sock)
                if status is None:
                    sock.close()
                    sock = None
            with lock:
                answered[f"{kind} {status}"] = answered.get(f"{kind} {status}", 0) + 1
        if sock:
            sock.close()

    def block(first: int, last: int, clients: int = 8) -> None:
        threads = [threading.Thread(target=client, args=(first + c, last, clients)) for c in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    try:
        block(0, 800)  # warm-up
        started, xs, rows = time.monotonic(), [], []
        for first in range(0, requests, 1000):
            block(first, min(first + 1000, requests))
            time.sleep(0.2)
            xs.append(min(first + 1000, requests))
            rows.append(held(proc.pid))
        seconds = time.monotonic() - started
        time.sleep(3)
        idle = held(proc.pid)
    finally:
        proc.kill()
        proc.wait(10)
    out = {"steps": requests, "seconds": round(seconds, 1), "answered": dict(sorted(answered.items())), "after_3s_idle": idle,
           "rss_mb_every_1000": [round(r["rss_kb"] / 1024, 1) for r in rows], **growth(xs, rows)}  # fmt: skip
    print(line("serve requests", out), f" ({seconds:.0f} s)", out["rss_mb_every_1000"], flush=True)
    return out


def index(runs: int, folder: Path) -> dict[str, Any]:
    from PIL import Image

    from uform.demo import write_media

    media, into, notes, rng = folder / "media", folder / "index", folder / "notes.txt", random.Random(0)
    write_media(media, per_modality=6)
    texts: list[str] = []
    xs, rows = [], []
    for i in range(runs):
        texts.append(f"a red circle number {i}")
        if len(texts) > 1:
            texts[rng.randrange(len(texts) - 1)] += " edited"
        notes.write_text("\n".join(texts) + "\n")
        pictures = sorted(p for p in media.glob("image-*"))
        if i % 3 == 0 and pictures:
            picture = pictures[rng.randrange(len(pictures))]
            picture.rename(picture.with_name(f"image-moved{i}{picture.suffix}"))
        if i % 5 == 4:
            Image.new("RGB", (48, 48), (i * 5 % 256, 0, 0)).save(media / "edited.png")
        if i % 7 == 6 and pictures:
            sorted(media.glob("image-*"))[0].unlink()
        done = subprocess.run(["/usr/bin/time", "-f", "MAXRSS %M", sys.executable, "-m", "uform.cli", "index", str(media), str(notes), "--into", str(into), "--quiet"],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"uform index failed ({done.returncode}): {done.stderr}")
        found = re.search(r"MAXRSS (\d+)", done.stderr)
        files = [p for p in into.rglob("*") if p.is_file()]
        xs.append(i)
        rows.append({"rss_kb": int(found.group(1)) if found else 0, "index_bytes": sum(p.stat().st_size for p in files), "index_files": len(files), "fds": 0, "threads": 0, "maps": 0})
    out = {"steps": runs, "items": len(texts) + len(list(media.iterdir())), "files": sorted(p.name for p in into.iterdir()), **growth(xs, rows)}
    r = out
    print(f"index runs {runs}: index {r['index_bytes']['first']} -> {r['index_bytes']['last']} bytes ({r['index_bytes']['per_step']:+.0f} B/run), "
          f"files {r['index_files']['last']} ({r['index_files']['per_step']:+.4f}/run), peak RSS {r['rss_kb']['first'] / 1024:.1f} -> {r['rss_kb']['last'] / 1024:.1f} MB; {out['files']}", flush=True)  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="verbs,loads,serve,index")
    p.add_argument("--quantizations", default="f32,bf16,e4m3")
    p.add_argument("--calls", type=int, default=2000, help="calls of each verb (video: a quarter)")
    p.add_argument("--loads", type=int, default=200)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--runs", type=int, default=50, help="runs of uform index")
    p.add_argument("--model", default=None, metavar="PATH", help="the checkpoint the verbs part calls (default: the default model)")
    args = p.parse_args()
    parts, quantizations = args.parts.split(","), args.quantizations.split(",")
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        if "verbs" in parts:
            from uform.demo import write_media

            write_media(folder / "demo")
            result["verbs"] = {q: verbs(q, args.calls, folder / "demo", args.model) for q in quantizations}
        if "loads" in parts:
            result["loads"] = {q: loads(q, args.loads) for q in quantizations}
        if "serve" in parts:
            result["serve"] = serve(args.requests)
        if "index" in parts:
            result["index"] = index(args.runs, folder / "index-runs")
    save("long_runs", result)


if __name__ == "__main__":
    main()
