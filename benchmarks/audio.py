"""Audio throughput: seconds of audio encoded per second, from files and from samples.

    python benchmarks/audio.py [--presets tiny,small] [--items 32] [--threads 1,2] [--seconds 1]

For each preset and executor size: ``audio_encode`` of ``items`` recordings twice the
window long (44.1 kHz stereo WAV, FLAC, MP3; 48 kHz Opus in Ogg) and
``audio_encode_samples`` of the same sound as float32 mono at 44.1 kHz (resampled) and at
the tower's rate (not), beside the tower graph alone on prepared windows and the PyTorch
reference tower (FP32 eager) on the same windows. "x realtime" is
window seconds encoded per wall second. The stats split each call into decode (batch
preparation, in threads), compute (ONNX Runtime) and the part of decode the compute loop
waited for; "overlap" is decode that ran while ONNX Runtime computed (decode - waited), and
its share of the most that could (the smaller of decode and compute; the first batch's
decode and the last batch's compute never overlap). Writes
benchmarks/results/audio.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
import media_audio as media
from common import rate, save, table


def recordings(directory: Path, items: int, seconds: float) -> dict[str, list[Any]]:
    """Per input kind, ``items`` different chords of ``seconds``: files and float32 buffers."""
    out: dict[str, list[Any]] = {}
    for name in ("wav", "flac", "mp3", "opus-ogg"):
        r = media.FORMATS[name][3]
        out[name] = [media.write_format(directory, name, media.tone(seconds, r, (220.0 + 7 * i, 330.0 + 5 * i)), f"r{i}") for i in range(items)]
    out["samples 44.1k"] = [media.tone(seconds, 44100, (220.0 + 7 * i, 330.0 + 5 * i)).mean(axis=0) for i in range(items)]
    out["samples 16k"] = [media.tone(seconds, 16000, (220.0 + 7 * i, 330.0 + 5 * i)).mean(axis=0) for i in range(items)]
    return out


def measure(model: Any, kind: str, items: list[Any], window_seconds: float, seconds: float) -> dict[str, Any]:
    import uform

    arena, stats = uform.Arena(), uform.AudioEncodeStats()
    if kind.startswith("samples"):
        sr = 44100 if "44.1k" in kind else 16000
        call = lambda: model.audio_encode_samples(items, sr, arena, stats=stats)
    else:
        call = lambda: model.audio_encode(items, arena, stats=stats)
    per_second = rate(call, len(items), seconds)
    calls = stats.items / len(items)
    return {
        "input": kind,
        "items/s": round(per_second, 1),
        "x realtime": round(per_second * window_seconds, 1),
        "decode ms/call": round(1000 * stats.seconds_decode / calls, 1),
        "compute ms/call": round(1000 * stats.seconds_compute / calls, 1),
        "waited ms/call": round(1000 * stats.seconds_preprocess / calls, 1),
        # decode that ran while ONNX Runtime computed, and its share of the most that could
        "overlap ms/call": round(1000 * (stats.seconds_decode - stats.seconds_preprocess) / calls, 1),
        "overlap of max": f"{(stats.seconds_decode - stats.seconds_preprocess) / max(min(stats.seconds_decode, stats.seconds_compute), 1e-9):.0%}",
        "audio s read/item": round(stats.audio_seconds / stats.items, 2),
    }


def graph_only(model: Any, items: int, window: int, seconds: float) -> float:
    from uform.model import runtime_of

    runner = runtime_of(model).placement.runners["audio"]
    feed = np.random.default_rng(0).standard_normal((items, window)).astype(np.float32) * 0.1
    return rate(lambda: runner.run(["embeddings"], {"samples": feed}), items, seconds)


def reference_only(ckpt: Path, items: int, window: int, threads: int, seconds: float) -> float:
    """Items/s of the PyTorch reference tower (FP32 eager) on the same windows."""
    import torch

    from uform.exporters.reference import ReferenceModel

    torch.set_num_threads(threads)
    tower = ReferenceModel.from_checkpoint(ckpt).towers["audio"]
    feed = torch.from_numpy(np.random.default_rng(0).standard_normal((items, window)).astype(np.float32) * 0.1)

    def run() -> None:
        with torch.no_grad():
            tower.encode(feed)

    return rate(run, items, seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--items", type=int, default=32)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()

    import uform
    from uform.core import checkpoint
    from uform.core.host import get_host

    results: dict[str, Any] = {"items": args.items, "presets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            cfg = get_host().modalities["audio"].tower.presets[preset]
            window_seconds = cfg["samples"] / cfg["sample_rate"]
            ckpt = Path(tmp) / f"{preset}.safetensors"
            checkpoint.save(ckpt, *checkpoint.new(get_host(), preset, 0, ["audio"]))
            directory = Path(tmp) / preset
            directory.mkdir()
            started = time.perf_counter()
            inputs = recordings(directory, args.items, 2 * window_seconds)
            print(f"{preset}: window {window_seconds:g} s; made {args.items} x 4 files of {2 * window_seconds:g} s in {time.perf_counter() - started:.1f} s")
            rows = []
            for threads in (int(t) for t in args.threads.split(",")):
                with uform.Executor(threads) as executor:
                    model = uform.Model.load_ram(ckpt, executor=executor)
                    graph = graph_only(model, args.items, cfg["samples"], args.seconds)
                    rows.append({"threads": threads, "input": "graph only", "items/s": round(graph, 1), "x realtime": round(graph * window_seconds, 1)})
                    ref = reference_only(ckpt, args.items, cfg["samples"], threads, args.seconds)
                    rows.append({"threads": threads, "input": "PyTorch reference", "items/s": round(ref, 1), "x realtime": round(ref * window_seconds, 1)})
                    for kind, items in inputs.items():
                        rows.append({"threads": threads, **measure(model, kind, items, window_seconds, args.seconds)})
            columns = ["threads", "input", "items/s", "x realtime", "decode ms/call", "compute ms/call", "waited ms/call", "overlap ms/call", "overlap of max", "audio s read/item"]
            print(table(rows, columns) + "\n")
            results["presets"][preset] = {"window_seconds": window_seconds, "rows": rows}
    print(f"wrote {save('audio', results)}")


if __name__ == "__main__":
    main()
