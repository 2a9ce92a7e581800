"""What the checks before FFmpeg and Pillow read a file cost on ordinary files.

    python benchmarks/media_preread.py [--repeats 8]

Progressive photo-like JPEGs (640x480, 2000x1500, quality 90): ``jpeg.check`` (its segments
walked, the fill bytes between its scans counted) against decoding the picture to 224x224,
CPU time, the best of ``10 x --repeats`` and of ``--repeats``.

A WAV and a FLAC as FFmpeg writes them (a 34-byte ``LIST`` chunk; an encoder tag and 8 KB of
padding), each a 20 s 44.1 kHz stereo chord, decoded to a 10 s window at 16 kHz as
``audio_encode`` does: FFmpeg given the path (their metadata is under
``uform.plugins.media.metadata.SPLICE_FROM``) against FFmpeg given the
:class:`~uform.plugins.media.metadata.Spliced` file, read through Python calls, that leaves the
metadata out (``SPLICE_FROM = 0``). CPU time of the process, the best of ``--repeats``
decodes each way, alternated three times; a shared machine's numbers are noisy.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
import media_audio  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    from uform.plugins.media import audio, metadata
    from uform.plugins.media.files import Source

    import io

    import numpy as np
    from media import pattern
    from PIL import Image

    from uform.plugins.media import image, jpeg

    def best(call: Callable[[], object], repeats: int) -> float:
        times = []
        for _ in range(repeats):
            start = time.process_time()
            call()
            times.append(time.process_time() - start)
        return min(times) * 1000

    with tempfile.TemporaryDirectory() as directory:
        for height, width in ((480, 640), (1500, 2000)):
            noise = np.random.default_rng(0).integers(-12, 12, (height, width, 3))
            photo = np.clip(pattern(height, width).astype(np.int16) + noise, 0, 255).astype(np.uint8)
            out = io.BytesIO()
            Image.fromarray(photo).save(out, "JPEG", quality=90, progressive=True)
            path = str(Path(directory) / "photo.jpg")
            Path(path).write_bytes(out.getvalue())

            def check() -> None:
                with open(path, "rb") as f:
                    jpeg.check(Source(0, path), f)

            checked = best(check, 10 * args.repeats)
            decoded = best(lambda: image.decode(Source(0, path), 224), args.repeats)
            print(f"progressive JPEG {width}x{height}: check {checked:.3f} ms, decode {decoded:.1f} ms ({100 * checked / decoded:.2f} %)")

    limit = metadata.SPLICE_FROM
    with tempfile.TemporaryDirectory() as directory:
        for name in ("wav", "flac"):
            path = str(media_audio.write_format(Path(directory), name, media_audio.tone(20.0, 44100, (220.0, 330.0))))
            best = {"path": float("inf"), "spliced": float("inf")}
            for _ in range(3):
                for how, splice_from in (("path", limit), ("spliced", 0)):
                    metadata.SPLICE_FROM = splice_from
                    for _ in range(args.repeats):
                        start = time.process_time()
                        audio.decode(Source(0, path), 16000, 160000)
                        best[how] = min(best[how], time.process_time() - start)
            metadata.SPLICE_FROM = limit
            ratio = best["spliced"] / best["path"]
            print(f"{name}: path {best['path'] * 1000:.1f} ms, spliced {best['spliced'] * 1000:.1f} ms ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
