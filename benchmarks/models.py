"""Converted CLIP and SigLIP models at their real geometries (random weights: no download):
the parity table and the speed goals of issue 59, against transformers in the same run.

    python benchmarks/models.py [--models clip-b32,clip-b16,siglip-b16] [--parts parity,speed,conversion,openvino]
                                [--images 32] [--seconds 3] [--rounds 3] [--batches 1,32]

Per model: transformers' ``CLIPModel`` / ``SiglipModel`` (``save_pretrained`` with its
tokenizer and image processor, tests/hf_models.py), converted with ``uform.convert`` to an F32
file and to the default BF16 one. The parts (``--parts``; default all but ``openvino``):

- ``parity``: the least cosine of uform's text and image embeddings with transformers'
  ``get_text_features`` / ``get_image_features`` in float32 over tests/hf_models.py's corpus and
  8 pictures, per file and load; the share of corpus texts whose token ids equal the family
  tokenizer's; the largest pixel difference of uform's preprocessing from
  ``AutoImageProcessor.from_pretrained(dir)`` on JPEG photos of 8 aspect ratios;
- ``conversion``: the conversion to BF16 against reading the source, each cold, in turns
  (:func:`conversion` says what each figure is);
- ``speed`` (CLIP ViT-B/16): ``image_encode`` of 640x480 JPEGs (the default BF16 load) against
  transformers' ``CLIPModel`` fed by its image processor in float32 and under BF16 autocast,
  ``text_encode`` of 12-byte queries one at a time against transformers float32;
- ``openvino`` (CLIP ViT-B/16): uform's image tower against OpenVINO bf16 on the tower
  ``uform export`` writes (:func:`openvino`; OpenVINO runs in benchmarks/.openvino-venv, made
  from PyPI the first time, by benchmarks/openvino_peer.py).

Writes benchmarks/results/models.json: the parts run now, over the previous file's other parts
(``runs`` keeps each part's load average). ``--tiny``: small geometries, for
tests/test_benchmarks.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from common import rate, save, table  # noqa: E402

import hf_models  # noqa: E402

GEOMETRIES = {"clip-b32": ("clip", hf_models.CLIP_B32), "clip-b16": ("clip", hf_models.CLIP_B16), "siglip-b16": ("siglip", hf_models.SIGLIP_B16)}
TINY = {"clip-b32": ("clip", hf_models.CLIP_SMALL), "clip-b16": ("clip", hf_models.CLIP_SMALL), "siglip-b16": ("siglip", hf_models.SIGLIP_SMALL)}
ASPECTS = [(640, 480), (480, 640), (1024, 768), (1920, 1080), (1080, 1920), (500, 500), (1200, 300), (300, 1200)]
QUERY = "a red circle"  # 12 bytes


def photos(directory: Path, count: int, size: tuple[int, int]) -> list[Path]:
    """JPEG files with photo-like content (as benchmarks/media.py writes them): smooth gradients plus noise."""
    from media import pattern  # tests/media.py
    from PIL import Image

    rng = np.random.default_rng(size[0] * 7 + size[1])
    out = []
    for i in range(count):
        picture = pattern(size[1], size[0], seed=i).astype(np.int16) + rng.integers(-12, 12, (size[1], size[0], 3))
        path = directory / f"photo{size[0]}x{size[1]}-{i}.jpg"
        Image.fromarray(np.clip(picture, 0, 255).astype(np.uint8)).save(path, "JPEG", quality=90)
        out.append(path)
    return out


def unit(x: Any) -> np.ndarray:
    a = np.asarray(x, np.float64)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def drop_cache(path: Path) -> None:
    """The file's clean pages dropped from the page cache (no root needed), so a read reads the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_seconds(path: Path) -> float:
    drop_cache(path)
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(64 << 20)
        while f.readinto(buf):
            pass
    return time.perf_counter() - t


def disk_seconds(path: Path) -> float:
    """The source read from the disk into the page cache alone, copying nothing (``sendfile`` to
    /dev/null, cold): the disk's own time, below a program's read."""
    drop_cache(path)
    t = time.perf_counter()
    fd, null = os.open(path, os.O_RDONLY), os.open(os.devnull, os.O_WRONLY)
    try:
        offset, size = 0, os.fstat(fd).st_size
        while offset < size:
            offset += os.sendfile(null, fd, offset, size - offset)
    finally:
        os.close(fd)
        os.close(null)
    return time.perf_counter() - t


def load_seconds(path: Path) -> float:
    """The source read as a program reads it: safetensors' numpy loader, every tensor an array (cold)."""
    from safetensors.numpy import load_file

    drop_cache(path)
    t = time.perf_counter()
    load_file(path)
    return time.perf_counter() - t


def conversion(directory: Path, source: Path, out: Path, rounds: int) -> dict[str, Any]:
    """The conversion to BF16 against reading its source, each cold (the source's pages dropped
    from the page cache first), in turns (``rounds`` of each, interleaved, so that both see the
    same machine), the best of each: ``uform.convert`` in this process (after a first conversion:
    the imports done) into a new file (the last round's output is removed first, outside the
    timing: replacing an old 290 MiB file costs its removal, 0.07 s here), with its CPU time
    (the process's user and system seconds); the read as a program reads a file (``read`` into a
    64 MiB buffer) and as the disk alone delivers it (``sendfile`` to /dev/null, no copy);
    safetensors' ``load_file`` of the source; and once, ``uform convert`` in a new process
    (Python's start and uform's imports included), all cold."""
    reads, disks, took, cpu = [], [], [], []
    for _ in range(rounds):
        reads.append(read_seconds(source))
        disks.append(disk_seconds(source))
        out.unlink(missing_ok=True)
        drop_cache(source)
        before, t = os.times(), time.perf_counter()
        convert_file(directory, out)
        took.append(time.perf_counter() - t)
        after = os.times()
        cpu.append(after.user - before.user + after.system - before.system)
    loaded = min(load_seconds(source) for _ in range(2))
    out.unlink()
    drop_cache(source)
    t = time.perf_counter()
    command = "import sys; from uform.cli import main; sys.exit(main(sys.argv[1:]))"
    subprocess.run([sys.executable, "-c", command, "convert", str(directory), str(out)], check=True, capture_output=True)
    process = time.perf_counter() - t
    best = int(np.argmin(took))
    return {"source MiB": round(source.stat().st_size / 2**20, 1), "out MiB": round(out.stat().st_size / 2**20, 1),
            "read s": round(min(reads), 3), "reads s": [round(r, 3) for r in reads],
            "disk s": round(min(disks), 3), "disks s": [round(d, 3) for d in disks],
            "safetensors load_file s": round(loaded, 3), "convert (bf16) s": round(min(took), 3), "converts s": [round(t, 3) for t in took],
            "convert cpu s": round(cpu[best], 3), "ratio": round(min(took) / min(reads), 2), "ratio to disk": round(min(took) / min(disks), 2),
            "ratio to load_file": round(min(took) / loaded, 2), "uform convert process s": round(process, 3)}  # fmt: skip


def convert_file(directory: Path, out: Path) -> None:
    from uform.convert import convert

    convert(directory, out)


def parity(family: str, directory: Path, files: dict[str, Path], pictures: np.ndarray, s: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import torch
    from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

    import uform
    from uform import Arena, Scalar

    model = AutoModel.from_pretrained(directory).eval()
    tok = AutoTokenizer.from_pretrained(directory)
    context = model.config.text_config.max_position_embeddings
    enc = tok(hf_models.CORPUS, padding="max_length" if family == "siglip" else True, truncation=True, max_length=context, return_tensors="pt")
    mean, std = (hf_models.CLIP_MEAN, hf_models.CLIP_STD) if family == "clip" else ([0.5] * 3, [0.5] * 3)
    x = (pictures.astype(np.float32) / 255 - np.float32(mean)) / np.float32(std)
    with torch.no_grad():
        text = model.get_text_features(**({"input_ids": enc["input_ids"]} if family == "siglip" else dict(enc))).pooler_output.numpy()
        image = model.get_image_features(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()).pooler_output.numpy()
    rows = []
    for label, path, q in (("f32 file", files["f32"], Scalar.F32), ("bf16 file", files["bf16"], Scalar.F32),
                           ("bf16 file", files["bf16"], Scalar.BF16), ("bf16 file", files["bf16"], Scalar.E4M3)):  # fmt: skip
        with uform.Model.load_ram(path, quantization=q) as m:
            t = unit(m.text_encode(hf_models.CORPUS, Arena()).embeddings)
            i = unit(m.image_encode_pixels(list(pictures), Arena()).embeddings)
            ref_t, ref_i = unit(text), unit(image)
            nearest = all(np.allclose(r[np.argmax(g @ r.T, axis=1)], r, atol=1e-6) for g, r in ((t, ref_t), (i, ref_i)))
            rows.append({"file": label, "load": q.value, "backend": m.backend, "text min cos": f"{(t * ref_t).sum(1).min():.6f}",
                         "image min cos": f"{(i * ref_i).sum(1).min():.6f}", "nearest own": "yes" if nearest else "NO"})  # fmt: skip
    # token ids and pixels
    from uform.core.safetensors import parse
    from uform.plugins.media.frames import Pixels
    from uform.plugins.media.image import decode
    from uform.plugins.media.files import sources
    from uform.plugins.media.text import read

    c = parse(memoryview(files["bf16"].read_bytes()))
    import json

    cfg = json.loads(c.metadata["uform"])
    held = read(c.metadata, context, cfg["towers"]["text"]["vocab_size"], "towers.text").encode(hf_models.CORPUS)
    want = tok(hf_models.CORPUS, truncation=True, max_length=context)["input_ids"]
    same = sum(list(map(int, a)) == b for a, b in zip(held.ids, want))
    processor = AutoImageProcessor.from_pretrained(directory)
    fit = Pixels.read(cfg["towers"]["image"], "image").fit
    worst = 0.0
    from PIL import Image

    with tempfile.TemporaryDirectory() as tmp:
        for w, h in ASPECTS:
            path = photos(Path(tmp), 1, (w, h))[0]
            ours = decode(sources([path.read_bytes()], "bytes")[0], fit)[0].astype(np.float64)
            pv = processor(images=[Image.open(path).convert("RGB")], return_tensors="np")["pixel_values"][0].transpose(1, 2, 0)
            theirs = (pv * np.array(processor.image_std) + np.array(processor.image_mean)) * 255
            worst = max(worst, float(np.abs(ours - theirs).max()))
    return rows, {"token ids equal": f"{same}/{len(want)}", "pixel max diff (levels)": round(worst, 2), "processor": type(processor).__name__}


def speed(directory: Path, bf16: Path, n: int, seconds: float, s: int) -> dict[str, Any]:
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

    import uform
    from uform import Arena

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = photos(Path(tmp), n, (640, 480))
        model = CLIPModel.from_pretrained(directory).eval()
        processor = AutoImageProcessor.from_pretrained(directory)
        tok = AutoTokenizer.from_pretrained(directory)

        def hf_images(autocast: bool) -> None:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                for i in range(0, n, 32):
                    images = [Image.open(f).convert("RGB") for f in files[i : i + 32]]
                    model.get_image_features(**processor(images=images, return_tensors="pt"))

        def hf_query() -> None:
            with torch.no_grad():
                model.get_text_features(**tok([QUERY], return_tensors="pt"))

        # transformers first, with no uform model open (its ONNX Runtime threads would spin beside torch's)
        f32 = rate(lambda: hf_images(False), n, seconds, runs=1)
        auto = rate(lambda: hf_images(True), n, seconds, runs=1)
        q_hf = median_ms(hf_query, seconds)
        del model
        with uform.Model.load_ram(bf16) as m:
            arena = Arena()
            out["uform"] = f"{m.describe().quantization.value} load, {m.backend} backend: {m.compute}"
            ours = rate(lambda: m.image_encode(files, arena), n, seconds, runs=1)
            q_ours = median_ms(lambda: m.text_encode([QUERY], arena), seconds)
        out["image_encode 640x480 JPEG"] = {"uform items/s": round(ours, 2), "transformers f32 items/s": round(f32, 2),
                                            "transformers bf16 autocast items/s": round(auto, 2),
                                            "vs f32": round(ours / f32, 2), "vs bf16 autocast": round(ours / auto, 2)}  # fmt: skip
        out["text_encode 12-byte query"] = {"uform ms": round(q_ours, 3), "transformers f32 ms": round(q_hf, 3), "speed-up": round(q_hf / q_ours, 2)}
        out["processor"] = type(processor).__name__
    return out


def openvino(bf16: Path, s: int, seconds: float, batches: tuple[int, ...]) -> dict[str, Any]:
    """uform's image tower of the converted file (the default BF16 load, ``image_encode_pixels``
    on pixels of the tower's size, the input the exported tower takes) against OpenVINO bf16
    running the tower ``uform export`` writes from the same file (benchmarks/openvino_peer.py:
    its own process and environment), at each batch size: uform, then OpenVINO, then uform
    again (the better of uform's two runs: each side sees the machine of its turn)."""
    from openvino_peer import measure

    import uform
    from uform import Arena

    pixels = list(np.random.default_rng(0).integers(0, 256, (max(batches), s, s, 3), dtype=np.uint8))
    ours: dict[int, float] = {}
    held = ""

    def run_uform() -> None:
        nonlocal held
        with uform.Model.load_ram(bf16) as m:
            arena = Arena()
            held = f"{m.describe().quantization.value} load, {m.backend} backend: {m.compute}"
            for b in batches:
                ours[b] = max(ours.get(b, 0.0), rate(lambda b=b: m.image_encode_pixels(pixels[:b], arena), b, seconds, runs=2))

    run_uform()
    peer = measure("openvino bf16", bf16, "image", seconds, batches)  # with no uform model open: its threads would spin beside OpenVINO's
    run_uform()
    out: dict[str, Any] = {"uform": held, "openvino": peer.get("held") if peer else "failed (see stderr)"}
    for b in batches:
        theirs = peer.get(f"items/s @{b}") if peer else None
        out[f"batch {b}"] = {"uform items/s": round(ours[b], 2), "openvino bf16 items/s": round(theirs, 2) if theirs else None,
                             "uform / openvino": round(ours[b] / theirs, 2) if theirs else None}  # fmt: skip
    return out


def merged(results: dict[str, Any], parts: set[str], keep: bool) -> dict[str, Any]:
    """``results`` over the previous result file's parts that this run did not run (with
    ``keep``; each part keeps the load its own run saw: ``runs``)."""
    from common import RESULTS

    import json

    previous: dict[str, Any] = {}
    path = RESULTS / "models.json"
    if keep and path.exists():
        try:
            previous = json.loads(path.read_text())
        except ValueError:
            previous = {}
    run = {"load average at start": results.pop("load average at start"), "load average at end": results.pop("load average at end")}
    runs = {part: previous.get("runs", {}).get(part) for part in ("parity", "speed", "conversion", "openvino") if part in previous}
    runs.update({part: run for part in parts})
    kept = {part: previous[part] for part in ("parity", "speed", "conversion", "openvino") if part in previous and part not in parts}
    return {**kept, **results, "runs": {k: v for k, v in runs.items() if v is not None}}


def median_ms(fn: Any, seconds: float) -> float:
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 5:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="clip-b32,clip-b16,siglip-b16")
    parser.add_argument("--images", type=int, default=32, help="640x480 JPEGs for the speed run (default 32)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--parts", default="parity,speed,conversion",
                        help="parity, speed, conversion, openvino (OpenVINO bf16 on the exported image tower: "
                             "benchmarks/.openvino-venv, made from PyPI the first time); default: all but openvino")
    parser.add_argument("--batches", default="1,32", help="batch sizes of the openvino part (default 1,32)")
    parser.add_argument("--rounds", type=int, default=3, help="cold reads and conversions of each source, in turns (default 3)")
    parser.add_argument("--tiny", action="store_true", help="small geometries (a smoke run)")
    args = parser.parse_args()

    import torch

    from uform.convert import convert
    from uform.core.executor import available_cores
    from uform.plugins.cpu import machine_classes

    torch.set_num_threads(available_cores())
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - {"parity", "speed", "conversion", "openvino"}
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    geometries = TINY if args.tiny else GEOMETRIES
    results: dict[str, Any] = {"note": "shared machine (other engineers' jobs ran beside this one): timings are noisy",
                               "threads": available_cores(), "cpu_class": machine_classes()[-1].value,
                               "load average at start": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
    results.update({part: {} for part in sorted(parts)})
    all_rows: list[dict[str, Any]] = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        family, geometry = geometries[name]
        s = geometry["vision"]["image_size"]
        with tempfile.TemporaryDirectory() as tmp:
            directory = (hf_models.make_clip if family == "clip" else hf_models.make_siglip)(Path(tmp) / name, geometry)
            files = {"f32": Path(tmp) / "f32.safetensors", "bf16": Path(tmp) / "bf16.safetensors"}
            convert(directory, files["f32"], dtype="f32")  # also imports what the family's conversion needs (SigLIP: transformers)
            source = directory / "model.safetensors"
            if "conversion" in parts:
                results["conversion"][name] = conversion(directory, source, files["bf16"], args.rounds)
                c = results["conversion"][name]
                print(f"{name}: convert {c['convert (bf16) s']:.3f} s, read {c['read s']:.3f} s ({c['ratio']:.2f}x)", flush=True)
            else:
                convert(directory, files["bf16"])
            if "parity" in parts:
                rng = np.random.default_rng(0)
                base = rng.integers(0, 256, (8, 8, 8, 3)).astype(np.float32)
                pictures = np.clip(np.repeat(np.repeat(base, s // 8, 1), s // 8, 2) + rng.normal(0, 30, (8, s, s, 3)), 0, 255).astype(np.uint8)
                rows, extra = parity(family, directory, files, pictures, s)
                for r in rows:
                    all_rows.append({"model": name, **r, **extra})
                results["parity"][name] = {"rows": rows, **extra}
            if name == "clip-b16" and "speed" in parts:
                results["speed"][name] = speed(directory, files["bf16"], args.images, args.seconds, s)
                print(results["speed"][name], flush=True)
            if name == "clip-b16" and "openvino" in parts:
                results["openvino"] = {name: openvino(files["bf16"], s, args.seconds, tuple(int(b) for b in args.batches.split(",")))}
                print(results["openvino"][name], flush=True)
    results["load average at end"] = [round(x, 2) for x in os.getloadavg()]
    if all_rows:
        print(table(all_rows, ["model", "file", "load", "backend", "text min cos", "image min cos", "nearest own", "token ids equal", "pixel max diff (levels)", "processor"]))
    for name, c in results.get("conversion", {}).items():
        print(f"conversion {name}: {c}")
    path = save("models", merged(results, parts, keep=not args.tiny))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
