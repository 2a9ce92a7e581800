"""What leaving a FLAC's or WAV's metadata out of FFmpeg's reads costs on ordinary recordings.

    python benchmarks/media_preread.py [--repeats 8]

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

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
import media_audio  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    from uform.plugins.media import audio, metadata
    from uform.plugins.media.files import Source

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
