"""docs/models-clap.md's speed table: ``python benchmarks/clap.py`` (a few minutes on 2 cores).

A random ``ClapModel`` at transformers' default geometry (laion/clap-htsat-unfused's: RoBERTa-base
text, HTSAT-tiny audio; a byte-level BPE tokenizer trained here) converted to a float32 uform file;
uform's ``text_encode`` and ``audio_encode_samples`` (F32, BF16 and E4M3 loads) against transformers'
tokenizer + ``get_text_features`` and ``ClapFeatureExtractor`` + ``get_audio_features`` (float32),
both on the same threads (``--threads``), in items a second: the best of ``--rounds`` rounds in
turns (:func:`turns`: the loads are open side by side and each round times every run once), so
that every column sees the same machine (on a shared one whose load moves, runs timed minutes apart
differ by more than the loads do). ``--parity``: instead,
the cosines of uform's F32, BF16 and E4M3 loads to transformers on those texts and recordings.
``--profile``: instead, where each load's time goes, op by op (:func:`profile`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import numpy as np  # noqa: E402

PRODUCTS = ("Gemm", "FusedGemm", "MatMulBF16", "MatMulE4M3")  # the matrix products over weights: ONNX Runtime's (F32) and the op library's


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--texts", type=int, default=64, help="captions a call (default 64)")
    parser.add_argument("--clips", type=int, default=8, help="10 s recordings at 48 kHz a call (default 8)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="the tests' small geometry (a quick check that it runs)")
    parser.add_argument("--parity", action="store_true", help="print the cosines to transformers instead of the speed")
    parser.add_argument("--profile", action="store_true", help="print where each load's time goes, op by op (ONNX Runtime's profiler), instead of the speed")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoTokenizer, ClapFeatureExtractor, ClapModel

    import clap_text_models as cm
    import uform
    from uform import Arena, Executor, Scalar
    from uform.convert import convert

    torch.set_num_threads(args.threads)
    full: dict[str, Any] = {} if args.small else {"text": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
                                                  "audio": {"patch_embeds_hidden_size": 96, "hidden_size": 768, "depths": [2, 2, 6, 2], "num_attention_heads": [4, 8, 16, 32]}}  # fmt: skip
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(cm.TEXTS[:20], 2)) for _ in range(args.texts)]
    if args.parity:  # each text once, so that "nearest its own" is defined: distinct pairs
        pairs = [f"{a} {b}" for i, a in enumerate(cm.TEXTS[:20]) for b in cm.TEXTS[i + 1 : 20]]
        texts = [pairs[i] for i in rng.permutation(len(pairs))[: args.texts]]
    clips = [rng.standard_normal(480000).astype(np.float32) * 0.1 for _ in range(args.clips)]
    with tempfile.TemporaryDirectory() as tmp:
        source = cm.make_clap(Path(tmp) / "clap", text=full.get("text", cm.TEXT_SMALL), audio=full.get("audio", cm.AUDIO_SMALL))
        out = Path(tmp) / "clap.safetensors"
        convert(source, out, dtype="f32")
        model = ClapModel.from_pretrained(str(source)).eval()
        tokenizer, extractor = AutoTokenizer.from_pretrained(str(source)), ClapFeatureExtractor.from_pretrained(str(source))

        def theirs_text() -> None:
            with torch.no_grad():
                model.get_text_features(**tokenizer(texts, padding=True, truncation=True, return_tensors="pt"))

        def theirs_audio() -> None:
            with torch.no_grad():
                model.get_audio_features(**extractor(clips, sampling_rate=48000, return_tensors="pt"))

        if args.parity:
            return parity(out, texts, clips, theirs_text, theirs_audio, model, tokenizer, extractor)
        if args.profile:
            return profile(out, texts, clips, args.rounds, args.threads)
        loads = {q.value: uform.Model.load_ram(out, quantization=q, executor=Executor(args.threads)) for q in (Scalar.F32, Scalar.BF16, Scalar.E4M3)}
        runs: dict[tuple[str, str], Any] = {}
        for q, m in loads.items():
            m.text_encode(texts[:2], Arena())
            m.audio_encode_samples(clips[:1], 48000, Arena())
            runs["text", q] = lambda m=m: m.text_encode(texts, Arena())
            runs["audio", q] = lambda m=m: m.audio_encode_samples(clips, 48000, Arena())
        theirs_text()
        theirs_audio()
        runs["text", "hf"], runs["audio", "hf"] = theirs_text, theirs_audio
        seconds = turns(runs, args.rounds)
        for m in loads.values():
            m.close()
    load = os.getloadavg()[0]
    print(f"| items a second ({args.threads} threads, load {load:.1f}) | uform F32 load | uform BF16 load | uform E4M3 load | transformers float32 |")
    print("|---|---|---|---|---|")
    for name, what, count in (("text", f"{args.texts} captions a call", args.texts), ("audio", f"{args.clips} recordings of 10 s at 48 kHz a call", args.clips)):
        rate = {q: count / seconds[name, q] for q in ("f32", "bf16", "e4m3", "hf")}
        cells = [f"{rate['f32']:.1f} ({rate['f32'] / rate['hf']:.1f}x)"]
        cells += [f"{rate[q]:.1f} ({rate[q] / rate['hf']:.1f}x; {rate[q] / rate['f32']:.2f}x F32)" for q in ("bf16", "e4m3")]
        print(f"| {name} ({what}) | {' | '.join(cells)} | {rate['hf']:.1f} |", flush=True)


def parity(out: Path, texts: list[str], clips: list[np.ndarray], *references: Any) -> None:
    """Each load's least and mean cosine to transformers float32, and whether every item is nearest its own."""
    import torch

    import uform
    from uform import Arena, Scalar

    _, _, model, tokenizer, extractor = references
    with torch.no_grad():
        want_text = model.get_text_features(**tokenizer(texts, padding=True, truncation=True, return_tensors="pt")).pooler_output.numpy()
        want_audio = model.get_audio_features(**extractor(clips, sampling_rate=48000, return_tensors="pt")).pooler_output.numpy()
    print("| cosine to transformers float32 (least, mean) | texts | recordings |\n|---|---|---|")
    for q in (Scalar.F32, Scalar.BF16, Scalar.E4M3):
        with uform.Model.load_ram(out, quantization=q) as m:
            got = (m.text_encode(texts, Arena()).embeddings, m.audio_encode_samples(clips, 48000, Arena()).embeddings)
        cells = []
        for ours, want in zip(got, (want_text, want_audio)):
            cos = np.sum(ours * want, axis=1)
            own = bool(((ours @ want.T).argmax(axis=1) == np.arange(len(want))).all())
            cells.append(f"{cos.min():.7f}, {cos.mean():.7f}{', each nearest its own' if own else ''}")
        print(f"| uform {q.value.upper()} load | {cells[0]} | {cells[1]} |", flush=True)
    closest = [float(np.max(w @ w.T - 2 * np.eye(len(w)))) for w in (want_text, want_audio)]
    print(f"| transformers: the closest two items | {closest[0]:.7f} | {closest[1]:.7f} |")


def profile(out: Path, texts: list[str], clips: list[np.ndarray], rounds: int, threads: int) -> None:
    """Each load's milliseconds a call by op type, side by side: for each tower, the three loads
    open at once with ONNX Runtime's profiler on and ``rounds`` calls of each in turns; each node's
    least times over the calls (by its input shapes: a text call runs a bucket's nodes at each
    length, an audio call a batch's at one; a call's worth of its runs, the least of them),
    summed by op type (the matrix products over weights as one row)."""
    from uform import Arena

    columns: dict[tuple[str, str], Counter[str]] = {}
    for tower in ("text", "audio"):
        with tempfile.TemporaryDirectory() as tmp:
            loads = profiled_loads(out, threads, tmp)
            call = (lambda m: m.text_encode(texts, Arena())) if tower == "text" else (lambda m: m.audio_encode_samples(clips, 48000, Arena()))
            turns({q: lambda m=m: call(m) for q, m in loads.items()}, rounds)
            for q, m in loads.items():
                m.close()  # ends the sessions: ONNX Runtime writes their profiles (the other tower's has no nodes run)
                runs: dict[tuple[str, str], list[float]] = {}  # a node's times at one input shape
                kinds: dict[tuple[str, str], str] = {}
                for path in Path(tmp).glob(f"{q}-*.json"):
                    for e in json.loads(path.read_text()):
                        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                            key = (e["name"], json.dumps(e["args"].get("input_type_shape")))
                            runs.setdefault(key, []).append(e["dur"] / 1e3)
                            kinds[key] = "products" if e["args"]["op_name"] in PRODUCTS else e["args"]["op_name"]
                columns[tower, q] = Counter()
                for key, times in runs.items():  # a call runs it len(times) / rounds times (batches of one shape): its least that many
                    columns[tower, q][kinds[key]] += sum(sorted(times)[: len(times) // rounds])
    ops = sorted({op for c in columns.values() for op in c}, key=lambda op: -max(c[op] for c in columns.values()))
    print(f"| ms a call ({threads} threads, each node's least of {rounds} calls) | " + " | ".join(f"{t} {q.upper()}" for t, q in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for op in [op for op in ops if max(c[op] for c in columns.values()) >= 1.0]:
        print(f"| {op} | " + " | ".join(f"{c[op]:.1f}" for c in columns.values()) + " |")
    print("| all | " + " | ".join(f"{sum(c.values()):.1f}" for c in columns.values()) + " |", flush=True)


def profiled_loads(out: Path, threads: int, folder: str) -> dict[str, Any]:
    """The F32, BF16 and E4M3 loads of ``out`` with ONNX Runtime's profiler on, each session's
    profile written into ``folder`` as ``<load>-*.json`` when the load closes."""
    import uform
    from uform import Executor, Scalar
    from uform.plugins import cpu, e4m3
    from uform.plugins.sessions import replicas

    loads = {}
    for q in (Scalar.F32, Scalar.BF16, Scalar.E4M3):

        def options(*args: Any, q: Scalar = q, **kwargs: Any) -> Any:
            so = replicas.session_options(*args, **kwargs)
            so.enable_profiling, so.profile_file_prefix = True, f"{folder}/{q.value}-"
            return so

        saved = e4m3.session_options, cpu.session_options
        e4m3.session_options = cpu.session_options = options  # uform's own backends, as they open their sessions
        try:
            loads[q.value] = uform.Model.load_ram(out, quantization=q, executor=Executor(threads))
        finally:
            e4m3.session_options, cpu.session_options = saved
    return loads


def turns(runs: dict[Any, Any], rounds: int) -> dict[Any, float]:
    """Each run's fastest of ``rounds``, in seconds, the runs timed in turns: every round times each
    run once, each round starting one run further on, so that no run is always the first."""
    keys = list(runs)
    times: dict[Any, float] = {}
    for r in range(rounds):
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            started = time.perf_counter()
            runs[key]()
            times[key] = min(times.get(key, float("inf")), time.perf_counter() - started)
    return times

if __name__ == "__main__":
    main()
