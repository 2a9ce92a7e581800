"""Image and video throughput, in one run.

    python benchmarks/media.py [--preset small] [--seconds 1] [--images 96] [--clips 3] [--cpu-class x86-64-v3] [--openvino]

``--cpu-class`` pins uform's load to that class's kernels; on a machine above x86-64-v3, run
the script with ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2``
and ``--cpu-class x86-64-v3`` to compare AVX2 kernels with AVX2 PyTorch peers (the capability
PyTorch ran and what uform held are printed; ONNX Runtime's own float32 ops still use what
the machine has). Fairer still, where the CPU has CPUID faulting: ``python
benchmarks/cpu_view.py x86-64-v3 benchmarks/media.py ...``, where every library of the run,
ONNX Runtime's included, sees an AVX2-only CPU (the view is printed).

Images/s from JPEG files end to end (decode in threads, overlapped with the tower), of the
image tower alone (preprocessed pixels fed straight to the ONNX Runtime session), of the
PyTorch reference fed by a plain PIL pipeline (open, RGB, resize, crop, batch: no overlap),
and of a Hugging Face transformers ViT of the same geometry (random init from a ViTConfig,
nothing downloaded) with its ViTImageProcessor. With ``--openvino``, OpenVINO too (bf16 and f32
inference precision, ``openvino_peer.py``: the tower as ``uform export`` writes it, in a process
and an environment of its own) on batches of 32 preprocessed pictures, against uform's tower on
the same batches; and fed by uform's decoding, composed from the two measured rates as if the
decoding were hidden behind OpenVINO's compute as uform hides it (the smaller of the two rates)
and as if not (one after the other). Then clips/s for sampling the video tower's
frames (8 on ``small``) from 10 s 640x480 H.264 clips: the seek plan of uform.plugins.media.video
against reading the clip through, at 1 keyframe a second and at 1 keyframe per 250 frames,
and video_encode end to end. Every image rate is the best of timed calls after a warm-up call
(each call a whole set of ``--images``), never a first call: one-time costs (a library's first
products, its primitives' creation) differ between the peers. Writes
benchmarks/results/media.json.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from common import cpu_view, describe_view, rate, save, table  # noqa: E402
from openvino_peer import measure as openvino  # noqa: E402


def photos(directory: Path, count: int, size: tuple[int, int]) -> list[Path]:
    """JPEG files with photo-like content: smooth gradients plus sensor-like noise."""
    from media import pattern
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        picture = pattern(size[1], size[0], seed=i).astype(np.int16) + rng.integers(-12, 12, (size[1], size[0], 3))
        path = directory / f"photo{i}.jpg"
        Image.fromarray(np.clip(picture, 0, 255).astype(np.uint8)).save(path, "JPEG", quality=90)
        out.append(path)
    return out


def movie(path: Path, seconds: int, gop: int) -> Path:
    """A 640x480 30 fps H.264 clip of moving content."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 640, 480, "yuv420p"
        stream.codec_context.gop_size = gop
        stream.codec_context.options = {"preset": "ultrafast", "keyint_min": str(gop), "sc_threshold": "0"}
        y, x = np.mgrid[0:480, 0:640]
        for i in range(30 * seconds):
            picture = np.stack([(x + 4 * i) % 256, (y + 2 * i) % 256, np.full_like(x, (7 * i) % 256)], -1).astype(np.uint8)
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def pil_pipeline(paths: list[Path], size: int) -> np.ndarray:
    """The plain way: open, convert, resize the shorter side, crop the centre, stack."""
    from PIL import Image

    out = []
    for p in paths:
        im = Image.open(p).convert("RGB")
        scale = size / min(im.size)
        im = im.resize((max(size, round(im.width * scale)), max(size, round(im.height * scale))), Image.Resampling.BICUBIC)
        left, top = (im.width - size) // 2, (im.height - size) // 2
        out.append(np.asarray(im.crop((left, top, left + size, top + size))))
    return np.stack(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--clips", type=int, default=3)
    parser.add_argument("--cpu-class", default=None, help="pin uform's load to this class's kernels")
    parser.add_argument("--openvino", action="store_true", help="OpenVINO's bf16 and f32 runs of the image tower as peers (openvino_peer.py)")
    args = parser.parse_args()

    import torch

    import uform
    from uform.core import checkpoint
    from uform.core.executor import available_cores
    from uform.core.host import get_host
    from uform.exporters.reference import ReferenceModel
    from uform.model import runtime_of
    from uform.plugins.media import video as sampling
    from uform.plugins import video
    from uform.plugins.media import frames
    from uform.plugins.media import files as sources

    threads = available_cores()
    torch.set_num_threads(threads)
    rows: list[dict[str, Any]] = []
    results: dict[str, Any] = {"preset": args.preset, "threads": threads, "note": "shared machine: numbers are noisy"}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ckpt = root / "model.safetensors"
        config, tensors = checkpoint.new(get_host(), args.preset, 0, ["image", "video"])
        checkpoint.save(ckpt, config, tensors)
        model = uform.Model.load_ram(ckpt, cpu_class=uform.CPUClass(args.cpu_class) if args.cpu_class else None)
        results["uform"] = f"{model.describe().quantization} weights, {model.compute} [{model.backend}]"
        results["torch_capability"] = torch.backends.cpu.get_cpu_capability()
        results["cpu_view"] = cpu_view()
        print(f"uform: {results['uform']}; PyTorch: ATen {results['torch_capability']}; {describe_view(results['cpu_view'])}")
        reference = ReferenceModel.from_checkpoint(ckpt)
        icfg, vcfg = config.towers["image"], config.towers["video"]
        s, n = icfg["image_size"], args.images

        # -- images ----------------------------------------------------------------------
        for label, size in (("640x480", (640, 480)), ("2000x1500", (2000, 1500))):
            files = photos(root, n, size)
            arena, stats = uform.Arena(), uform.ImageEncodeStats()
            end_to_end = rate(lambda: model.image_encode(files, arena, stats=stats), n, args.seconds, runs=1)
            pixels = np.stack([frames.fit(frames.from_array(np.asarray(_open_rgb(f))), s) for f in files])
            runner = runtime_of(model).placement.runners["image"]
            batches = [pixels[i : i + 32] for i in range(0, n, 32)]
            tower = rate(lambda: [runner.run(["embeddings"], {"pixels": b}) for b in batches], n, args.seconds, runs=1)
            tower_ref = reference.towers["image"]

            def torch_pil() -> None:
                with torch.no_grad():
                    for i in range(0, n, 32):
                        tower_ref(torch.from_numpy(pil_pipeline(files[i : i + 32], s)))

            ref_rate = rate(torch_pil, n, args.seconds, runs=1)
            hf_rate = _hf_vit(icfg, files, args.seconds)
            calls = max(1, stats.items // n)
            hidden = 1 - stats.seconds_preprocess / max(stats.seconds_decode, 1e-9)
            peers: list[dict[str, str]] = []
            if args.openvino:
                decoding = stats.items / max(stats.seconds_decode, 1e-9)  # uform's decoding alone, images/s (its threads)
                for precision in ("bf16", "f32"):
                    peer = openvino(f"openvino {precision}", ckpt, "image", args.seconds, (32,))
                    if peer is None:
                        continue
                    ov = peer["items/s @32"]
                    peers += [
                        {"what": f"OpenVINO {precision} image tower only (batch 32), {label}; uform's tower / it: {tower / ov:.2f}x", "rate": f"{ov:.2f} images/s"},
                        {"what": f"OpenVINO {precision} fed by uform's decoding, {label}: hidden / serial; uform's end to end / them: "
                                 f"{end_to_end / min(ov, decoding):.2f}x / {end_to_end * (1 / ov + 1 / decoding):.2f}x",
                         "rate": f"{min(ov, decoding):.2f} / {1 / (1 / ov + 1 / decoding):.2f} images/s"},
                    ]  # fmt: skip
                    results.setdefault(f"images_{label}_openvino", {})[precision] = {
                        "tower_only": ov, "held": peer["held"], "decoding": decoding,
                        "fed_hidden": min(ov, decoding), "fed_serial": 1 / (1 / ov + 1 / decoding),
                    }  # fmt: skip
            rows += [
                {"what": f"uform image_encode, JPEG {label}", "rate": f"{end_to_end:.2f} images/s"},
                {"what": f"uform image tower only (ONNX Runtime, batch 32), same {label} set", "rate": f"{tower:.2f} images/s"},
                {"what": f"PyTorch reference + PIL pipeline, JPEG {label}", "rate": f"{ref_rate:.2f} images/s"},
                {"what": f"transformers ViT + ViTImageProcessor, JPEG {label}", "rate": f"{hf_rate:.2f} images/s"},
                *peers,
            ]
            results[f"images_{label}"] = {
                "end_to_end": end_to_end, "tower_only": tower, "reference_pil": ref_rate, "transformers_vit": hf_rate,
                "end_to_end_over_tower": end_to_end / tower, "decode_hidden_fraction": hidden,
                "per_call": {"seconds_decode": stats.seconds_decode / calls, "seconds_waited": stats.seconds_preprocess / calls,
                             "seconds_compute": stats.seconds_compute / calls, "seconds_total": stats.seconds_total / calls},
                "reduced_jpegs": stats.reduced // calls,
            }  # fmt: skip
            print(f"images {label}: decode {stats.seconds_decode / calls * 1e3:.0f} ms/call, waited {stats.seconds_preprocess / calls * 1e3:.0f}, "
                  f"compute {stats.seconds_compute / calls * 1e3:.0f}, total {stats.seconds_total / calls * 1e3:.0f}: {hidden:.0%} of decoding hidden")  # fmt: skip
            for f in files:
                f.unlink()

        # -- video -----------------------------------------------------------------------
        vt = video.read(vcfg, config)
        for gop in (30, 250):
            clips = [movie(root / f"clip{gop}_{i}.mp4", 10, gop) for i in range(args.clips)]
            items = [sources.Source(i, str(c)) for i, c in enumerate(clips)]
            seek = rate(lambda: [sampling.sample(src, vt.frames, vt.pixels.image_size, True) for src in items], len(clips), args.seconds)
            through = rate(lambda: [sampling.sample(src, vt.frames, vt.pixels.image_size, False) for src in items], len(clips), args.seconds)
            every = rate(lambda: [_decode_every_frame(c) for c in clips], len(clips), args.seconds)
            vstats = uform.VideoEncodeStats()
            arena = uform.Arena()
            e2e = rate(lambda: model.video_encode(clips, arena, stats=vstats), len(clips), args.seconds)
            calls = max(1, vstats.items // len(clips))
            rows += [
                {"what": f"sample {vt.frames} frames, seek plan, 1 key/{gop} frames", "rate": f"{seek:.1f} clips/s"},
                {"what": f"sample {vt.frames} frames, read through, 1 key/{gop} frames", "rate": f"{through:.1f} clips/s"},
                {"what": f"decode every frame (no RGB), 1 key/{gop} frames", "rate": f"{every:.1f} clips/s"},
                {"what": f"uform video_encode end to end, 1 key/{gop} frames", "rate": f"{e2e:.1f} clips/s"},
            ]
            results[f"video_gop{gop}"] = {
                "seek_plan": seek, "read_through": through, "decode_every_frame": every, "video_encode": e2e,
                "frames_decoded_per_clip": vstats.frames_decoded / max(vstats.items, 1), "seeks_per_clip": vstats.seeks / max(vstats.items, 1),
                "per_call": {"seconds_decode": vstats.seconds_decode / calls, "seconds_waited": vstats.seconds_preprocess / calls,
                             "seconds_compute": vstats.seconds_compute / calls},
            }  # fmt: skip
    print(table(rows, ["what", "rate"]))
    print(f"({threads} threads; a shared machine: numbers are noisy)")
    print(f"wrote {save('media', results)}")


def _open_rgb(path: Path) -> Any:
    from PIL import Image

    return Image.open(path).convert("RGB")


def _decode_every_frame(path: Path) -> int:
    import av

    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


def _hf_vit(cfg: dict[str, Any], files: list[Path], seconds: float) -> float:
    """A transformers ViT of the tower's geometry, random init, fed by its own image processor."""
    import torch
    from PIL import Image
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    vit = ViTModel(ViTConfig(
        hidden_size=cfg["width"], num_hidden_layers=cfg["depth"], num_attention_heads=cfg["heads"],
        intermediate_size=cfg["mlp_width"], image_size=cfg["image_size"], patch_size=cfg["patch_size"],
    )).eval()  # fmt: skip
    processor = ViTImageProcessor(size={"height": cfg["image_size"], "width": cfg["image_size"]})

    def run() -> None:
        with torch.no_grad():
            for i in range(0, len(files), 32):
                images = [Image.open(f).convert("RGB") for f in files[i : i + 32]]
                vit(**processor(images=images, return_tensors="pt"))

    return rate(run, len(files), seconds, runs=1)


if __name__ == "__main__":
    main()
