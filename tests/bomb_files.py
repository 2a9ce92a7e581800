"""Hostile media files built on the spot, for tests/test_media_bombs*.py and its measurement
(``python -m tests.test_media_bombs``): tags, pictures, segments, attachments, tracks and
declared sizes that would cost far more than the file's sound or pictures; and ``window``, how
those tests read a recording."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from tests import media_audio
from uform.plugins.media import audio as recordings
from uform.plugins.media import files as sources


def id3_tag(text_bytes: int) -> bytes:
    """An ID3v2.4 tag holding one TXXX frame of ``text_bytes`` letters."""

    def synchsafe(n: int) -> bytes:
        return bytes([(n >> 21) & 127, (n >> 14) & 127, (n >> 7) & 127, n & 127])

    body = b"\x03desc\x00" + b"A" * text_bytes
    frame = b"TXXX" + synchsafe(len(body)) + b"\x00\x00" + body
    return b"ID3\x04\x00\x00" + synchsafe(len(frame)) + frame


def window(item: Any) -> np.ndarray:
    return recordings.decode(sources.sources([item], "recordings")[0], 16000, 16000).samples


def flac_with(plain: bytes, blocks: list[tuple[int, bytes]]) -> bytes:
    """A FLAC with metadata ``blocks`` (type, body) put after its STREAMINFO."""
    pos, kept = 4, []
    while True:
        last, size = plain[pos] & 0x80, int.from_bytes(plain[pos + 1 : pos + 4], "big")
        kept.append((plain[pos] & 0x7F, plain[pos + 4 : pos + 4 + size]))
        pos += 4 + size
        if last:
            break
    every = kept[:1] + blocks + kept[1:]
    heads = [bytes([kind | (0x80 if i == len(every) - 1 else 0)]) + len(body).to_bytes(3, "big") + body for i, (kind, body) in enumerate(every)]
    return b"fLaC" + b"".join(heads) + plain[pos:]


def wav_with(plain: bytes, before: bytes, after: bytes) -> bytes:
    """A WAV with the chunks ``before`` put ahead of its ``data`` chunk and ``after`` behind it."""
    at = plain.index(b"data")
    body = plain[12:at] + before + plain[at:] + after
    return b"RIFF" + (4 + len(body)).to_bytes(4, "little") + b"WAVE" + body


def _ogg_crc(data: bytes) -> int:
    table = []
    for i in range(256):
        r = i << 24
        for _ in range(8):
            r = ((r << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if r & 0x80000000 else (r << 1) & 0xFFFFFFFF
        table.append(r)
    r = 0
    for b in data:
        r = ((r << 8) & 0xFFFFFFFF) ^ table[(r >> 24) ^ b]
    return r


def ogg_with_tags(data: bytes, size: int) -> bytes:
    """An Ogg Opus file whose OpusTags packet (its second page, replaced) holds a ``size``-byte tag."""
    import struct

    pages, pos = [], 0
    while pos < len(data):
        n = data[pos + 26]
        body = sum(data[pos + 27 : pos + 27 + n])
        pages.append((data[pos : pos + 27], data[pos + 27 : pos + 27 + n], data[pos + 27 + n : pos + 27 + n + body]))
        pos += 27 + n + body

    def page(flags: int, granule: int, seq: int, body: bytes, lacing: list[int]) -> bytes:
        p = b"OggS\x00" + bytes([flags]) + struct.pack("<qII", granule, serial, seq) + b"\x00" * 4 + bytes([len(lacing)]) + bytes(lacing) + body
        return p[:22] + struct.pack("<I", _ogg_crc(p)) + p[26:]

    serial = struct.unpack("<I", pages[0][0][14:18])[0]
    tags = b"OpusTags" + struct.pack("<I", 5) + b"uform" + struct.pack("<I", 1) + struct.pack("<I", size) + b"A=" + b"x" * (size - 2)
    out, seq, at = [b"".join(pages[0])], 1, 0
    while at < len(tags):
        part = tags[at : at + 255 * 255]
        at += len(part)
        lacing = [255] * (len(part) // 255) + ([len(part) % 255] if at >= len(tags) else [])
        out.append(page(0 if seq == 1 else 1, 0 if at >= len(tags) else -1, seq, part, lacing))
        seq += 1
    for header, lacing_bytes, body in pages[2:]:
        out.append(page(header[5], struct.unpack("<q", header[6:14])[0], seq, body, list(lacing_bytes)))
        seq += 1
    return b"".join(out)


def segment(marker: int, payload: int) -> bytes:
    return bytes([0xFF, marker]) + (payload + 2).to_bytes(2, "big") + b"x" * payload


def clip(width: int, height: int, container: str, codec: str, frames: int = 2) -> bytes:
    """A clip of ``frames`` black frames, encoded with PyAV."""
    import av

    out = io.BytesIO()
    with av.open(out, "w", format=container) as c:
        stream = c.add_stream(codec, rate=25)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast"} if codec == "libx264" else {"deadline": "realtime", "cpu-used": "8"}
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.zeros((height, width, 3), np.uint8), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                c.mux(packet)
        for packet in stream.encode(None):
            c.mux(packet)
    return out.getvalue()


def with_attachment(webm: bytes, size: int) -> bytes:
    """The WebM ``webm`` with an Attachments element of one ``size``-byte file before its first
    cluster (its Segment's size made unknown, as a live recording's is)."""

    def element(ident: bytes, body: bytes) -> bytes:
        return ident + (1 << 56 | len(body)).to_bytes(8, "big") + body

    segment_at = webm.index(b"\x18\x53\x80\x67") + 4
    length = 9 - webm[segment_at].bit_length()
    webm = webm[:segment_at] + b"\x01" + b"\xff" * 7 + webm[segment_at + length :]
    at = webm.index(b"\x1f\x43\xb6\x75")
    attached = element(b"\x61\xa7", element(b"\x46\x6e", b"a.bin") + element(b"\x46\x60", b"application/octet-stream") + element(b"\x46\xae", b"\x01") + element(b"\x46\x5c", b"\x00" * size))
    return webm[:at] + element(b"\x19\x41\xa4\x69", attached) + webm[at:]


def with_attachment_pointed(webm: bytes, size: int, voids: int = 0) -> bytes:
    """The WebM ``webm`` with an Attachments element of one ``size``-byte file at its end, after its
    clusters and ``voids`` empty Void elements before them, which a SeekHead first in its Segment points to."""

    def element(ident: bytes, body: bytes) -> bytes:
        return ident + (1 << 56 | len(body)).to_bytes(8, "big") + body

    def seek_head(position: int) -> bytes:
        return element(b"\x11\x4d\x9b\x74", element(b"\x4d\xbb", element(b"\x53\xab", b"\x19\x41\xa4\x69") + element(b"\x53\xac", position.to_bytes(8, "big"))))

    plain = with_attachment(webm, 0)  # its Segment's size made unknown
    plain = plain[: plain.index(b"\x19\x41\xa4\x69")] + plain[plain.index(b"\x1f\x43\xb6\x75") :]  # without the attachment
    segment = plain.index(b"\x18\x53\x80\x67") + 12
    at = plain.index(b"\x1f\x43\xb6\x75")
    attached = element(b"\x19\x41\xa4\x69", element(b"\x61\xa7", element(b"\x46\x6e", b"a.bin") + element(b"\x46\x60", b"application/octet-stream") + element(b"\x46\xae", b"\x01") + element(b"\x46\x5c", b"\x00" * size)))
    filler = b"\xec\x80" * voids
    position = len(plain) + len(seek_head(0)) + len(filler) - segment
    return plain[:segment] + seek_head(position) + plain[segment:at] + filler + plain[at:] + attached


def with_large_tracks(webm: bytes, size: int) -> bytes:
    """The WebM ``webm`` whose first TrackEntry ends with a Void element of ``size`` bytes (as a
    huge CodecPrivate would make its Tracks), its Segment's size made unknown."""

    def header(data: bytes, at: int) -> tuple[bytes, int, int]:  # an EBML element's ID, size and where its body starts
        n = 9 - data[at].bit_length()
        m = 9 - data[at + n].bit_length()
        return data[at : at + n], int.from_bytes(data[at + n : at + n + m], "big") & ((1 << (7 * m)) - 1), at + n + m

    data = with_attachment(webm, 0)
    data = data[: data.index(b"\x19\x41\xa4\x69")] + data[data.index(b"\x1f\x43\xb6\x75") :]
    tracks = data.index(b"\x18\x53\x80\x67") + 12  # the Segment's first element
    while data[tracks : tracks + 4] != b"\x16\x54\xae\x6b":
        _, element_size, body_at = header(data, tracks)
        tracks = body_at + element_size
    length = 9 - data[tracks + 4].bit_length()
    tracks_size = header(data, tracks)[1]
    body = data[tracks + 4 + length : tracks + 4 + length + tracks_size]
    entries, at = [], 0
    while at < len(body):  # its TrackEntry elements (ID 0xAE, one byte)
        n = 9 - body[at + 1].bit_length()
        entry_size = int.from_bytes(body[at + 1 : at + 1 + n], "big") & ((1 << (7 * n)) - 1)
        entries.append(body[at + 1 + n : at + 1 + n + entry_size])
        at += 1 + n + entry_size
    void = b"\xec" + (1 << 56 | size).to_bytes(8, "big") + b"\x00" * size
    new = b"".join(b"\xae" + (1 << 56 | len(e)).to_bytes(8, "big") + e for e in [entries[0] + void, *entries[1:]])
    return data[:tracks] + b"\x16\x54\xae\x6b" + (1 << 56 | len(new)).to_bytes(8, "big") + new + data[tracks + 4 + length + tracks_size :]


def m4a_with_video(width: int, height: int, container: str = "mp4") -> bytes:
    """An MP4 of 1 s of AAC sound beside one black ``width`` x ``height`` H.264 frame; with
    ``container="webm"``, a WebM of Opus sound and a VP9 frame."""
    import av

    out, signal = io.BytesIO(), media_audio.tone(1.0, 48000)
    webm = container == "webm"
    with av.open(out, "w", format=container) as c:
        sound = c.add_stream("libopus" if webm else "aac", rate=48000, layout="mono")
        moving = c.add_stream("libvpx-vp9" if webm else "libx264", rate=25)
        moving.width, moving.height, moving.pix_fmt = width, height, "yuv420p"
        moving.options = {"deadline": "realtime", "cpu-used": "8"} if webm else {"preset": "ultrafast"}
        frame = av.VideoFrame.from_ndarray(np.zeros((height, width, 3), np.uint8), format="rgb24")
        frame.pts = 0
        for packet in [*moving.encode(frame), *moving.encode(None)]:
            c.mux(packet)
        step = 960 if webm else 1024
        for start in range(0, signal.shape[1], step):
            chunk = av.AudioFrame.from_ndarray(np.ascontiguousarray(signal[:, start : start + step]), format="fltp", layout="mono")
            chunk.sample_rate = 48000
            for packet in sound.encode(chunk):
                c.mux(packet)
        for packet in sound.encode(None):
            c.mux(packet)
    return out.getvalue()


def m4a_with_cover(size: int) -> bytes:
    """:func:`m4a_with_video` (64x48) with an iTunes cover (``moov/udta/meta/ilst/covr``) of ``size`` bytes."""
    import struct

    def box(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", 8 + len(body)) + kind + body

    data = m4a_with_video(64, 48)
    at = data.index(b"moov") - 4  # the last box: FFmpeg writes it after the sound
    covr = box(b"covr", box(b"data", struct.pack(">II", 13, 0) + b"\xff\xd8\xff" + b"x" * size))
    meta = box(b"meta", bytes(4) + box(b"hdlr", bytes(8) + b"mdirappl" + bytes(9)) + box(b"ilst", covr))
    return data[:at] + box(b"moov", data[at + 8 :] + box(b"udta", meta))


def with_tags(webm: bytes, size: int) -> bytes:
    """The WebM ``webm`` with a Tags element of one ``size``-byte TagString before its first cluster."""

    def element(ident: bytes, body: bytes) -> bytes:
        return ident + (1 << 56 | len(body)).to_bytes(8, "big") + body

    at = webm.index(b"\x1f\x43\xb6\x75")
    simple = element(b"\x67\xc8", element(b"\x45\xa3", b"A") + element(b"\x44\x87", b"x" * size))
    return webm[:at] + element(b"\x12\x54\xc3\x67", element(b"\x73\x73", simple)) + webm[at:]


def picture_block(size: int) -> bytes:
    """A FLAC PICTURE block's body: a front cover (type 3), image/png, of ``size`` zero bytes."""
    import struct

    return struct.pack(">II", 3, 9) + b"image/png" + struct.pack(">IIIIII", 0, 1, 1, 24, 0, size) + b"\x00" * size


def ogg_tagged(size: int, codec: str = "libopus") -> bytes:
    """A 2 s Ogg file (``libopus``: Opus, mono; ``vorbis``: FFmpeg's Vorbis, stereo) whose tags
    hold one ``size``-letter tag (none for 0), muxed by FFmpeg."""
    import av

    out, vorbis = io.BytesIO(), codec == "vorbis"
    signal = media_audio.tone(2.0, 48000, (440.0, 660.0) if vorbis else (440.0,))
    layout, step = ("stereo", 1024) if vorbis else ("mono", 960)
    with av.open(out, "w", format="ogg") as muxer:
        if size:
            muxer.metadata["A"] = "x" * size
        stream = muxer.add_stream(codec, rate=48000, layout=layout)
        if vorbis:
            stream.codec_context.options = {"strict": "experimental"}
        for start in range(0, signal.shape[1], step):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(signal[:, start : start + step]), format="fltp", layout=layout)
            frame.sample_rate = 48000
            for packet in stream.encode(frame):
                muxer.mux(packet)
        for packet in stream.encode(None):
            muxer.mux(packet)
    return out.getvalue()


def png_with(kind: bytes, body: bytes, count: int) -> bytes:
    """An 8x8 PNG with ``count`` chunks ``kind`` of ``body`` before its image data."""
    import struct
    import zlib

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (8, 8, 3), np.uint8)).save(out, "PNG")
    plain = out.getvalue()
    at = plain.index(b"IDAT") - 4
    chunk = struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return plain[:at] + chunk * count + plain[at:]


def bombs(d: Path) -> dict[str, bytes]:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), np.uint8)).save(out, "JPEG")
    j = out.getvalue()
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), np.uint8)).save(out, "JPEG", progressive=True)
    p = out.getvalue()
    second = p.index(b"\xff\xda", p.index(b"\xff\xda") + 2)
    mp3_bytes = media_audio.write_format(d, "mp3", media_audio.tone(2.0, 44100, (440.0, 660.0))).read_bytes()
    wav = media_audio.write_format(d, "wav", media_audio.tone(2.0, 44100, (440.0, 660.0))).read_bytes()
    flac = media_audio.write_format(d, "flac", media_audio.tone(2.0, 44100, (440.0, 660.0))).read_bytes()
    info = b"INFO" + b"INAM" + (50_000_000).to_bytes(4, "little") + b"x" * 50_000_000
    comment = (5).to_bytes(4, "little") + b"uform" + (1).to_bytes(4, "little") + (16_000_000).to_bytes(4, "little") + b"A=" + b"x" * 15_999_998
    return {
        "id3-100MB.mp3": id3_tag(100_000_000) + mp3_bytes,
        "list-50MB.wav": wav_with(wav, b"LIST" + len(info).to_bytes(4, "little") + info, b""),
        "comment-16MB.flac": flac_with(flac, [(4, comment)]),
        "pictures-6x16MB.flac": flac_with(flac, [(6, picture_block(16_000_000))] * 6),
        "app3-5000x64KB.jpg": j[:2] + segment(0xE3, 65533) * 5000 + j[2:],
        "app3-1Mx0.jpg": j[:2] + segment(0xE3, 0) * 1_000_000 + j[2:],
        "fill-10MB.jpg": j[:2] + b"\xff" * 10_000_000 + j[2:],
        "progressive-fill-10MB.jpg": p[:second] + b"\xff" * 10_000_000 + p[second:],
        "progressive-app3-1500x64KB.jpg": p[:second] + segment(0xE3, 65533) * 1500 + p[second:],  # not walked: libjpeg skips them
        "progressive-app3-1Mx0.jpg": p[:second] + segment(0xE3, 0) * 1_000_000 + p[second:],
        "opus-tag-15MB.ogg": ogg_tagged(15_000_000),  # under MAX_OGG_HEADER_BYTES: left out (ogg.stripped)
        "vorbis-tag-15MB.ogg": ogg_tagged(15_000_000, "vorbis"),
        "opus-tag-1KB.ogg": ogg_tagged(1000),  # under metadata.SPLICE_FROM: FFmpeg reads it as it is
        "text-300k.png": png_with(b"tEXt", b"k\x00v", 300_000),
        "private-300k.png": png_with(b"prVt", b"abc", 300_000),
        "video-8000x6000.m4a": m4a_with_video(8000, 6000),  # audio_encode on it
        "video-8000x6000.weba": m4a_with_video(8000, 6000, "webm"),  # audio_encode on it
        "cover-100MB.m4a": m4a_with_cover(100_000_000),  # audio_encode on it
        "cover-16MB.m4a": m4a_with_cover(16_000_000),  # under mp4.MAX_METADATA_BYTES: read, not refused
        "8000x6000.mp4": clip(8000, 6000, "mp4", "libx264"),
        "8000x6000.webm": clip(8000, 6000, "webm", "libvpx"),
        "tags-100MB.webm": with_tags(clip(64, 48, "webm", "libvpx"), 100_000_000),  # read through, not held: left alone
        "attached-100MB.webm": with_attachment(clip(64, 48, "webm", "libvpx"), 100_000_000),
        "attached-100MB.weba": with_attachment(m4a_with_video(64, 48, "webm"), 100_000_000),  # audio_encode on it
        "attached-pointed-100MB.weba": with_attachment_pointed(m4a_with_video(64, 48, "webm"), 100_000_000, voids=140_000),
        "tracks-2MB-8000x6000.weba": with_large_tracks(m4a_with_video(8000, 6000, "webm"), 2 << 20),  # audio_encode on it
        "tracks-2MB-8000x6000.webm": with_large_tracks(clip(8000, 6000, "webm", "libvpx-vp9"), 2 << 20),
    }
