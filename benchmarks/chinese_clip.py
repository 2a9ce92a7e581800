"""docs/models-chinese-clip.md's speed table: ``python benchmarks/chinese_clip.py`` (about two minutes on 2 cores).

A random ``ChineseCLIPModel`` at OFA-Sys/chinese-clip-vit-base-patch16's geometry (RoBERTa-wwm-base
text, ViT-B/16 image, 12 layers each; the tests' ``vocab.txt``, tests/chinese_clip_models.py)
converted to a float32 uform file; uform's ``text_encode`` and ``image_encode`` of PNG files (F32
and BF16 loads) against transformers' ``BertTokenizer`` + ``get_text_features`` and Pillow's open +
``ChineseCLIPImageProcessorPil`` + ``get_image_features`` (float32), on the same threads
(``--threads``), the three runs in turns, best of ``--rounds``, in items a second."""

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
    parser.add_argument("--texts", type=int, default=32, help="captions a call (default 32)")
    parser.add_argument("--images", type=int, default=8, help="640x480 PNG files a call (default 8)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="the tests' small geometry (a quick check that it runs)")
    args = parser.parse_args(argv)

    import torch
    from PIL import Image
    from transformers import BertTokenizer, ChineseCLIPModel
    from transformers.models.chinese_clip.image_processing_pil_chinese_clip import ChineseCLIPImageProcessorPil

    import chinese_clip_models as cm
    import uform
    from uform import Arena, Scalar
    from uform.convert import convert

    torch.set_num_threads(args.threads)
    geometry = cm.SMALL if args.small else {key: ({**value, "num_hidden_layers": 12} if isinstance(value, dict) else value) for key, value in cm.BASE16.items()}
    rng = np.random.default_rng(0)
    texts = ["".join(rng.choice(cm.TEXTS[:8], 2)) for _ in range(args.texts)]
    with tempfile.TemporaryDirectory() as tmp:
        source = cm.make_chinese_clip(Path(tmp) / "cclip", geometry)
        paths = []
        for i in range(args.images):
            paths.append(Path(tmp) / f"{i}.png")
            Image.fromarray(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)).resize((640, 480), Image.Resampling.BICUBIC).save(paths[-1])
        out = Path(tmp) / "cclip.safetensors"
        convert(source, out, dtype="f32")
        model = ChineseCLIPModel.from_pretrained(str(source)).eval()
        tokenizer, processor = BertTokenizer.from_pretrained(str(source)), ChineseCLIPImageProcessorPil.from_pretrained(str(source))

        def theirs_text() -> None:
            with torch.no_grad():
                model.get_text_features(**tokenizer(texts, padding=True, truncation=True, return_tensors="pt"))

        def theirs_image() -> None:
            with torch.no_grad():
                model.get_image_features(**processor(images=[Image.open(p) for p in paths], return_tensors="pt"))

        files = [str(p) for p in paths]
        with uform.Model.load_ram(out, quantization=Scalar.F32) as f32, uform.Model.load_ram(out, quantization=Scalar.BF16) as bf16:
            for m in (f32, bf16):
                m.text_encode(texts[:2], Arena())
                m.image_encode(files[:1], Arena())
            theirs_text()
            theirs_image()
            text = turns([lambda: f32.text_encode(texts, Arena()), lambda: bf16.text_encode(texts, Arena()), theirs_text], args.rounds)
            image = turns([lambda: f32.image_encode(files, Arena()), lambda: bf16.image_encode(files, Arena()), theirs_image], args.rounds)
        rows = {"text": [args.texts / t for t in text], "image": [args.images / t for t in image]}
    print(f"| items a second ({args.threads} threads) | uform F32 load | uform BF16 load | transformers float32 |\n|---|---|---|---|")
    for name, what in (("text", f"{args.texts} captions a call"), ("image", f"{args.images} 640x480 PNG files a call")):
        f32, bf16, hf = rows[name]
        print(f"| {name} ({what}) | {f32:.1f} ({f32 / hf:.2f}x) | {bf16:.1f} ({bf16 / hf:.2f}x) | {hf:.1f} |", flush=True)


def turns(runs: list[Any], rounds: int) -> list[float]:
    """Each of ``runs``' fastest of ``rounds`` runs, in seconds, the runs taken in turns each round
    (so that the machine's other load falls on all of them alike)."""
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for run, kept in zip(runs, times):
            started = time.perf_counter()
            run()
            kept.append(time.perf_counter() - started)
    return [min(kept) for kept in times]


if __name__ == "__main__":
    main()
