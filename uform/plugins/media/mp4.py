"""How many index entries an MP4/MOV makes FFmpeg hold, read from its boxes before FFmpeg opens it.

FFmpeg's mov demuxer builds one index entry (about 70 bytes with its side tables) for every
sample a track's tables declare, as it opens the file, and for every sample of a fragment's
``trun`` as it reaches it. A count costs four bytes of the file whatever it says: a 1.8 KB
MP4 whose ``stsz`` declared 6·10⁷ samples of one constant size took 4.2 GB and 13 s to be
refused as truncated. :func:`declared_entries` sums what the tables declare, walking box
headers only (a few reads per box, no table but ``stsc`` read), so a file declaring more
than ``MAX_ENTRIES`` is refused before FFmpeg sees it (docs/media-video.md, "MP4 sample tables"). The same
walk reads a video track's frame size from its sample description, which the video reader
checks before FFmpeg's probe decodes a frame of it.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

import numpy as np

from .files import Source

MAX_ENTRIES = 4_000_000  # index entries over all tracks: about 280 MB of FFmpeg's index
MAX_DEPTH = 12  # boxes nested deeper are not walked (FFmpeg's own limit is 10)
# bytes of metadata boxes (udta, meta: tags, cover art), which FFmpeg reads whole and holds once
MAX_METADATA_BYTES = 16 << 20
# boxes FFmpeg reads as lists of boxes, whose tables it takes for the last track it met
_NESTED = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts", b"dinf", b"mvex", b"tref", b"udta", b"moof", b"traf", b"sinf", b"schi", b"wave"}
# FFmpeg indexes a chunk of uncompressed audio in pieces of up to 1024 samples, of at least
# 160 whatever the sample description says (512 or more for frames under 160 samples, the frame for GSM's 160)
_LEAST_PIECE = 160
MP4_FIRST = (b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide")  # the boxes an MP4 or MOV is known by first
_PIECE_ROWS = 4096  # stsc rows read at a time


def boxed(head: bytes) -> bool:
    """Whether the first bytes can be an MP4/MOV box: a size of 8 or more (or 0, 1).

    FFmpeg's probe takes a file for a MOV by any box it knows among the boxes its first bytes
    chain (an unknown box first will do), so every such file is walked; a WAV, FLAC, MP3, Ogg
    or WebM read this way is one box larger than the file, and the walk ends at once.
    """
    return len(head) >= 8 and int.from_bytes(head[:4], "big") not in range(2, 8)


class _Track:
    def __init__(self) -> None:
        self.audio = False
        self.samples = 0  # stsz / stz2 sample count
        self.one_tick = False  # stts: a single entry of duration 1 (FFmpeg indexes chunks, not samples)
        self.chunks = 0  # stco / co64 entry count
        self.most_per_chunk = 0  # the largest samples-per-chunk of stsc
        self.video = False
        self.frame = (0, 0)  # width, height of the first sample description (a video track's)

    def entries(self) -> int:
        if self.audio and self.one_tick:  # uncompressed audio: its chunks, each split in pieces
            return self.chunks * -(-self.most_per_chunk // _LEAST_PIECE)
        return self.samples


def declared_entries(f: BinaryIO) -> int:
    """Index entries the sample tables of every track and fragment declare, summed
    (an upper bound of what FFmpeg's index holds for the file)."""
    return declared(f)[0]


def declared(f: BinaryIO) -> tuple[int, tuple[int, int] | None]:
    """Index entries, as :func:`declared_entries`, and the largest frame (width, height) a video
    track's sample description declares (None without one)."""
    entries, frame, _, _ = described(f)
    return entries, frame


def described(f: BinaryIO) -> tuple[int, tuple[int, int] | None, int, str]:
    """As :func:`declared`, the bytes of its metadata boxes (``udta`` and ``meta`` boxes, one
    inside another counted once: tags and cover art, which FFmpeg reads whole), and the top-level
    box the file ends inside, in words, when that cuts its index (the ``moov`` box or a fragment):
    "" for a file whose index is whole."""
    end = f.seek(0, 2)
    tracks: list[_Track] = []
    fragments = tags = 0
    whole: set[bytes] = set()  # the kinds of the whole top-level boxes met
    cut = ""  # the top-level box the file ends inside
    cut_kind = b""  # its kind

    def u32(data: bytes, at: int) -> int:
        return int.from_bytes(data[at : at + 4], "big") if len(data) >= at + 4 else 0

    def walk(start: int, stop: int, depth: int, track: _Track | None, in_tags: bool = False) -> None:
        nonlocal fragments, tags, cut, cut_kind
        pos = start
        while pos + 8 <= stop:
            f.seek(pos)
            header = f.read(16)
            if len(header) < 8:
                return
            size, kind = struct.unpack(">I4s", header[:8])
            skip = 8
            if size == 1:
                if len(header) < 16:
                    return
                size, skip = int.from_bytes(header[8:16], "big"), 16
            elif size == 0:
                size = stop - pos
            if size < skip:
                return
            inside, after = pos + skip, min(pos + size, stop)
            if depth == 0 and pos + size > stop and not cut and kind.isalnum():
                cut, cut_kind = f"it ends {stop - pos} bytes into its {kind.decode()} box of {size}", kind
            elif depth == 0:
                whole.add(kind)
            if kind in (b"udta", b"meta") and not in_tags:
                tags += after - pos
            if kind in _NESTED and depth < MAX_DEPTH:
                if kind == b"trak":
                    track = _Track()
                    tracks.append(track)
                walk(inside, after, depth + 1, track, in_tags or kind == b"udta")
            elif kind == b"trun":
                f.seek(inside)
                fragments += u32(f.read(8), 4)
            elif track is not None and kind in (b"hdlr", b"stsz", b"stz2", b"stts", b"stco", b"co64", b"stsd"):
                f.seek(inside)
                body = f.read(44 if kind == b"stsd" else 20)
                if kind == b"hdlr":
                    track.audio = track.audio or body[8:12] == b"soun"  # a MOV has a second, of its data: "alis"
                    track.video = track.video or body[8:12] == b"vide"
                elif kind == b"stsd":  # its first entry: a visual sample entry's width and height
                    if len(body) == 44 and u32(body, 4):
                        track.frame = (int.from_bytes(body[40:42], "big"), int.from_bytes(body[42:44], "big"))
                elif kind in (b"stsz", b"stz2"):
                    track.samples = max(track.samples, u32(body, 8))
                elif kind == b"stts":
                    track.one_tick = u32(body, 4) == 1 and u32(body, 12) == 1
                else:
                    track.chunks = max(track.chunks, u32(body, 4))
            elif track is not None and kind == b"stsc":
                f.seek(inside)
                left = min(u32(f.read(8), 4), (after - inside - 8) // 12)  # rows of (first chunk, samples, description)
                while left > 0:
                    rows = np.frombuffer(f.read(12 * min(left, _PIECE_ROWS)), ">u4")
                    if len(rows) < 3:
                        break
                    track.most_per_chunk = max(track.most_per_chunk, int(rows[: len(rows) // 3 * 3].reshape(-1, 3)[:, 1].max()))
                    left -= len(rows) // 3
            pos += size

    walk(0, end, 0, None)
    frames = [t.frame for t in tracks if t.video]
    if b"moof" in whole or cut_kind == b"moof":  # fragmented: cut in a fragment, not in what follows them (mfra, an index FFmpeg needs not)
        cut = f"{cut}, before its fragments are whole" if cut_kind in (b"moof", b"mdat") else ""
    elif b"moov" in whole:
        cut = ""  # the index is whole: a cut in the samples is judged by where they end
    elif "moov" in cut:
        cut += ", the index of its samples"
    else:
        cut = f"{cut}, before its index (the moov box)" if cut else "or corrupt: it has no moov box, the index of its samples"
    return sum(t.entries() for t in tracks) + fragments, max(frames, key=lambda wh: wh[0] * wh[1]) if frames else None, tags, cut


def check(source: Source, f: BinaryIO) -> tuple[int, int] | None:
    """Refuse ``source`` (read through ``f``, seekable) when it is an MP4/MOV whose tables
    declare over ``MAX_ENTRIES`` index entries, or whose metadata boxes hold over
    ``MAX_METADATA_BYTES``; any other file passes after one read of 8 bytes.
    Gives the largest frame (width, height) a video track declares, None without one."""
    try:
        f.seek(0)
        head = f.read(8)
        if not boxed(head):
            return None
        entries, frame, tags, cut = described(f)
        f.seek(0)
    except Exception as exc:  # noqa: BLE001 - a read that fails, of a path or of the caller's object
        raise source.fail(f"cannot read the file ({type(exc).__name__}: {exc})") from None
    if cut and head[4:8] in MP4_FIRST:  # an MP4 (a WAV, FLAC or MP3 read as boxes is one box past its end)
        raise source.fail(f"is truncated{'' if cut.startswith('or') else ':'} {cut}")
    if entries > MAX_ENTRIES:
        raise source.fail(
            f"its MP4 tables declare {entries} samples, over the limit of {MAX_ENTRIES} "
            "(uform.plugins.media.mp4.MAX_ENTRIES) that FFmpeg's index is held to"
        )
    if tags > MAX_METADATA_BYTES:
        raise source.fail(
            f"its MP4 metadata (udta and meta boxes: tags, cover art) holds {tags} bytes, over the limit of "
            f"{MAX_METADATA_BYTES} (uform.plugins.media.mp4.MAX_METADATA_BYTES) that FFmpeg would read whole"
        )
    return frame
