"""docs/models-clap.md's speed table: ``python benchmarks/clap.py`` (a few minutes on 2 cores).

A random ``ClapModel`` at transformers' default geometry (laion/clap-htsat-unfused's: RoBERTa-base
text, HTSAT-tiny audio; a byte-level BPE tokenizer trained here) converted to a float32 uform file;
uform's ``text_encode`` and ``audio_encode_samples`` (F32 and BF16 loads) against transformers'
tokenizer + ``get_text_features`` and ``ClapFeatureExtractor`` + ``get_audio_features`` (float32),
both on the same threads (``--threads``), best of ``--rounds``, in items a second. ``--parity``: instead,
the cosines of uform's F32, BF16 and E4M3 loads to transformers on those texts and recordings."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import numpy as np  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--texts", type=int, default=64, help="captions a call (default 64)")
    parser.add_argument("--clips", type=int, default=8, help="10 s recordings at 48 kHz a call (default 8)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="the tests' small geometry (a quick check that it runs)")
    parser.add_argument("--parity", action="store_true", help="print the cosines to transformers instead of the speed")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoTokenizer, ClapFeatureExtractor, ClapModel

    import clap_text_models as cm
    import uform
    from uform import Arena, Scalar
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
        rows = {"text": [], "audio": []}  # type: dict[str, list[float]]
        for q in (Scalar.F32, Scalar.BF16):
            with uform.Model.load_ram(out, quantization=q) as m:
                m.text_encode(texts[:2], Arena())
                m.audio_encode_samples(clips[:1], 48000, Arena())
                rows["text"].append(args.texts / best(lambda: m.text_encode(texts, Arena()), args.rounds))
                rows["audio"].append(args.clips / best(lambda: m.audio_encode_samples(clips, 48000, Arena()), args.rounds))
        theirs_text()
        theirs_audio()
        rows["text"].append(args.texts / best(theirs_text, args.rounds))
        rows["audio"].append(args.clips / best(theirs_audio, args.rounds))
    print(f"| items a second ({args.threads} threads) | uform F32 load | uform BF16 load | transformers float32 |\n|---|---|---|---|")
    for name, what in (("text", f"{args.texts} captions a call"), ("audio", f"{args.clips} recordings of 10 s at 48 kHz a call")):
        f32, bf16, hf = rows[name]
        print(f"| {name} ({what}) | {f32:.1f} ({f32 / hf:.2f}x) | {bf16:.1f} ({bf16 / hf:.2f}x) | {hf:.1f} |", flush=True)


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


def best(run: Any, rounds: int) -> float:
    """The fastest of ``rounds`` runs, in seconds."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return float(min(times))


if __name__ == "__main__":
    main()
