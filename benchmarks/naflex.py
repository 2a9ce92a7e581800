"""docs/models-naflex.md's speed table: ``python benchmarks/naflex.py`` (a few minutes on 2 cores).

A random ``Siglip2Model`` at the base image tower's geometry (12 layers of width 768, patch 16,
256 positions) converted to a float32 uform file; uform's ``image_encode_pixels`` (F32 and BF16
loads, resize included) against transformers' ``get_image_features`` on the same pictures, 4 a
call, best of 3, in ms a picture. ``--layers 1 --rounds 1 --pictures 1`` is a quick check that it runs."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import numpy as np  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=12, help="the image tower's depth (default 12, the base tower's)")
    parser.add_argument("--rounds", type=int, default=3, help="calls timed, the best taken (default 3)")
    parser.add_argument("--pictures", type=int, default=4, help="pictures a call (default 4)")
    args = parser.parse_args(argv)
    import torch
    from PIL import Image
    from transformers import Siglip2Model
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    import naflex_models as nm
    import uform
    from uform import Arena, Scalar
    from uform.convert import convert
    from uform.plugins.media.naflex import grid_for

    torch.set_num_threads(2)
    base = {
        "text": nm.NAFLEX_SMALL["text"] | {"projection_size": 768},
        "vision": {"hidden_size": 768, "num_hidden_layers": args.layers, "num_attention_heads": 12, "intermediate_size": 3072, "patch_size": 16, "num_patches": 256},
    }
    with tempfile.TemporaryDirectory() as tmp:
        source, out = nm.make_siglip2(Path(tmp) / "base", base), Path(tmp) / "base.safetensors"
        convert(source, out, dtype="f32")
        model = Siglip2Model.from_pretrained(source).eval()
        proc = Siglip2ImageProcessorPil()
        print("| picture (grid) | uform F32 load | uform BF16 load | transformers float32 (with its processor) |\n|---|---|---|---|")
        for label, (w, h) in (("4000x3000", (4000, 3000)), ("640x640", (640, 640)), ("2000x40", (2000, 40))):
            pics = [nm.picture(w, h, i) for i in range(args.pictures)]
            grid = grid_for(h, w, 16, 256)
            ours = []
            for q in (Scalar.F32, Scalar.BF16):
                m = uform.Model.load_ram(out, quantization=q)
                m.image_encode_pixels(pics[:1], Arena())
                ours.append(best(lambda: m.image_encode_pixels(pics, Arena()), args.rounds))
            images = [Image.fromarray(p) for p in pics]
            inputs = proc(images=images, return_tensors="pt")
            with torch.no_grad():
                model.get_image_features(**inputs)
                alone = best(lambda: model.get_image_features(**inputs), args.rounds)
                whole = best(lambda: model.get_image_features(**proc(images=images, return_tensors="pt")), args.rounds)
            n = len(pics)
            print(f"| {label} ({grid[0]}x{grid[1]}) | {ours[0] / n:.0f} | {ours[1] / n:.0f} | {alone / n:.0f} ({whole / n:.0f}) |", flush=True)


def best(run: object, rounds: int = 3) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()  # type: ignore[operator]
        times.append(1000 * (time.perf_counter() - started))
    return float(np.min(times))


if __name__ == "__main__":
    main()
