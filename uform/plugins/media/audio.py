"""Recordings to windows on the host: files decoded, what FFmpeg reads of them bounded first.

Files decode with PyAV (FFmpeg) one packet at a time, each frame given to the window
(:mod:`uform.plugins.media.window`: mixed to mono, resampled, cut or padded) until it is
full, so a 10-hour file costs what its first seconds cost. Before FFmpeg opens a file, what
it would read whole is passed over or held to a limit (ID3 tags, a FLAC's, WAV's or Ogg
file's tags, MP4 tables, a video track's frame size, WebM attachments). Truncation is judged
against what the container declares (docs/media.md, "Recordings"). The audio plugin maps
:func:`decode` and :func:`resample` (the window's, for buffers) over the executor's threads.
"""

from __future__ import annotations

import re
from contextlib import ExitStack
from typing import Any, BinaryIO, cast

import numpy as np

from uform.core.errors import InputError

from . import id3, metadata, mp4, ogg, video
from .files import CUT_WHILE_OPENED, HeadKept, Source, falls_short
from .window import KINDS as _KINDS  # the window's names, imported from here too
from .window import CHUNK as CHUNK
from .window import NONFINITE
from .window import TAIL as TAIL
from .window import Recording as Recording
from .window import Window as Window
from .window import buffers as buffers
from .window import mono as mono
from .window import resample as resample

MAX_FAILED_PACKETS = 64  # undecodable packets in a row before a recording is refused
# FFmpeg probes a WAV's PCM for S/PDIF-wrapped DTS/AC-3 over up to 2500 packets, which is
# most of the time spent opening a WAV; one packet (16 KiB, several S/PDIF bursts) decides it.
OPEN_OPTIONS = {"max_probe_packets": "1"}



def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "strerror", None) or exc or type(exc).__name__)


def _wav_seconds(head: bytes) -> float | None:
    """Seconds a RIFF/WAVE header's ``data`` chunk declares (FFmpeg clamps it to the file)."""
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    pos, byte_rate = 12, 0
    while pos + 8 <= len(head):
        kind, size = head[pos : pos + 4], int.from_bytes(head[pos + 4 : pos + 8], "little")
        if kind == b"fmt " and pos + 20 <= len(head):
            byte_rate = int.from_bytes(head[pos + 16 : pos + 20], "little")
        if kind == b"data":
            return size / byte_rate if byte_rate and size not in (0, 0xFFFFFFFF) else None
        pos += 8 + size + (size & 1)
    return None


def _flushes_samples(packet: Any) -> bool:
    """Whether the decoder, flushed by demux's last (empty) packet, still holds samples."""
    import av

    try:
        return any(frame.samples for frame in packet.decode())
    except av.FFmpegError:
        return False


def _tagged_seconds(stream: Any) -> float | None:
    """Seconds a Matroska track's ``DURATION`` tag (``HH:MM:SS.nnnnnnnnn``, as FFmpeg and mkvmerge
    write it) declares; None where it has none or it does not parse."""
    tag = stream.metadata.get("DURATION", "")
    match = re.fullmatch(r"(\d{1,9}):([0-5]\d):([0-5]\d(?:\.\d{1,9})?)", tag.strip())
    return int(match[1]) * 3600 + int(match[2]) * 60 + float(match[3]) if match else None


def declared_seconds(container: Any, stream: Any, head: bytes) -> float | None:
    """How long the container says the audio is: the stream's duration, else its Matroska
    ``DURATION`` tag, else the container's where the stream is its only one (a longer stream
    beside it would speak for itself), or what a WAV header's ``data`` chunk declares (in
    ``head``, the file's first bytes) when that is longer."""
    found = None
    if stream.duration and stream.time_base:
        found = float(stream.duration * stream.time_base)
    elif (tagged := _tagged_seconds(stream)) is not None:
        found = tagged
    elif container.duration and all(s.index == stream.index or s.disposition & 0x400 for s in container.streams):
        found = container.duration / 1_000_000  # the longest stream's: the audio's only when it is alone (a cover aside)
    wav = _wav_seconds(head) if container.format.name == "wav" else None
    return max(found or 0.0, wav or 0.0) or None


def decode(source: Source, rate: int, samples: int) -> Recording:
    """Decode ``source`` packet by packet until the window (``samples`` at ``rate``) is full;
    InputError naming the item if it is bad."""
    with ExitStack() as held:
        return _decode(source, _target(source, held), rate, samples)


def _target(source: Source, held: ExitStack) -> Any:
    """What FFmpeg reads of ``source``: from where its leading ID3v2 tags end (never read whole
    by FFmpeg), a FLAC's or WAV's metadata left out, after its MP4 tables are checked; files
    uform opens are closed by ``held``."""
    if source.stream is not None and not source._seekable():  # a one-way stream is read by FFmpeg alone
        return HeadKept(cast(BinaryIO, id3.Dropped(source.stream)))  # its first bytes kept, for a WAV header's sizes
    f = source.open()
    if source.stream is None:
        held.callback(f.close)
    frame = mp4.check(source, f) or _webm_frame(source, f)  # a video track: FFmpeg's probe decodes a frame of it
    if frame is not None and frame[0] * frame[1] > video.MAX_FRAME_PIXELS:
        raise source.fail(
            f"its video track's frames are {frame[0]}x{frame[1]}, over the limit of {video.MAX_FRAME_PIXELS} pixels "
            "(uform.plugins.media.video.MAX_FRAME_PIXELS) that FFmpeg's probe would decode one of"
        )
    try:
        start = id3.tags_end(f)
        # a FLAC's, WAV's or Ogg Opus or Vorbis file's tags and pictures left out too
        spliced = metadata.stripped(f, start) or ogg.stripped(f, start, metadata.SPLICE_FROM)
        headers = metadata.ogg_header_bytes(f, start) if spliced is None else 0  # any other Ogg file's held to a limit
    except ValueError as exc:
        raise source.fail(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a read that fails, of a path or of the caller's object
        raise source.fail(f"cannot read the file ({type(exc).__name__}: {exc})") from None
    if spliced is not None:
        return metadata.Spliced(f, *spliced)
    if headers > metadata.MAX_OGG_HEADER_BYTES:
        raise source.fail(
            f"its Ogg headers (tags, pictures) hold over {metadata.MAX_OGG_HEADER_BYTES} bytes, "
            "the limit of uform.plugins.media.metadata.MAX_OGG_HEADER_BYTES"
        )
    return id3.After(f, start) if start else source.target()


def _webm_frame(source: Source, f: BinaryIO) -> tuple[int, int] | None:
    """The largest frame a WebM's (Matroska's) video track declares in its Tracks, after its
    attachments (read whole by FFmpeg) are held to ``video.MAX_ATTACHED_BYTES``; None for any
    other file, after one read of 4 bytes."""
    try:
        f.seek(0)
        if video.sniff(f.read(4)) != "webm":
            f.seek(0)
            return None
        return video.webm_declared(source, f)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - a read that fails, of a path or of the caller's object
        raise source.fail(f"cannot read the file ({type(exc).__name__}: {exc})") from None


def _held(container: Any) -> str:
    """What a file without an audio stream holds, for its refusal: its streams' kinds, and the
    files attached to it (a Matroska attachment is a file stored whole, not a stream to decode)."""
    kinds = sorted({s.type for s in container.streams if s.type != "attachment"})
    attached = [s.metadata for s in container.streams if s.type == "attachment"]
    said = f" (streams: {', '.join(kinds) or 'none'})" if container.streams else ""
    if attached:
        names = ", ".join(f"{m.get('filename', '?')[:80]} ({m.get('mimetype', '?')[:40]})" for m in attached[:3])
        more = f" and {len(attached) - 3} more" if len(attached) > 3 else ""
        said += (
            f"; the files attached to it ({names}{more}) are not read: extract one first "
            '(ffmpeg -dump_attachment:t "" -i FILE writes each under its own name)'
        )
    return said


def audio_stream(container: Any, index: int, path: str | None) -> Any:
    """The recording's audio stream: FFmpeg's best (``av_find_best_stream``: one marked default, an
    MP4's enabled track or a Matroska track flagged default, before others, and one for the hearing
    or visually impaired after), as players, torchcodec (transformers' ``load_audio``) and video's
    ``video_stream`` take it; one FFmpeg has a decoder for (else the first such default one, or the
    first such)."""
    if not container.streams.audio:
        raise InputError(index, f"holds no audio stream{_held(container)}", path)
    streams = [s for s in container.streams.audio if s.codec_context is not None]  # None: FFmpeg has no decoder for it
    if not streams:
        raise InputError(index, "holds audio in a codec this FFmpeg cannot decode", path)
    best = container.streams.best("audio")
    stream = next((s for s in streams if best is not None and s.index == best.index), None)
    return stream or next((s for s in streams if s.disposition & 1), streams[0])  # AV_DISPOSITION_DEFAULT


def _decode(source: Source, target: Any, rate: int, samples: int) -> Recording:
    import av

    index, path = source.index, source.path
    try:
        container: Any = av.open(target, metadata_errors="replace", options=OPEN_OPTIONS)
    except av.error.EOFError:
        raise InputError(index, CUT_WHILE_OPENED, path) from None
    except Exception as exc:  # noqa: BLE001 - FFmpeg, OS and metadata errors all mean "cannot open"
        raise InputError(index, f"is not a recording uform can decode ({_reason(exc)})", path) from None
    with container:
        stream = audio_stream(container, index, path)
        window = Window(rate, samples)
        skipped = in_row = 0
        ended = True
        try:
            for packet in container.demux(stream):
                if window.full:  # filled to the sample by what came before: is there more?
                    if packet.size or _flushes_samples(packet):
                        ended = False
                        break
                    continue
                try:
                    frames = packet.decode()
                except av.FFmpegError:
                    skipped, in_row = skipped + 1, in_row + 1
                    if in_row > MAX_FAILED_PACKETS:
                        raise InputError(index, f"is corrupt: {in_row} packets in a row fail to decode", path) from None
                    continue
                if any(frame.samples for frame in frames):  # a packet that decodes to nothing does not end a run
                    in_row = 0
                for frame in frames:
                    window.add(mono(frame), frame.sample_rate)
                if window.produced > samples:
                    ended = False
                    break
            window_samples = window.finish()
        except InputError:
            raise
        except (av.FFmpegError, ValueError) as exc:
            raise InputError(index, f"cannot be decoded past {window.seconds:.3f} s ({_reason(exc)})", path) from None
        if window.seconds == 0:
            failed = f" ({skipped} packets failed to decode)" if skipped else ""
            raise InputError(index, f"holds no decodable audio{failed}", path)
        head = target.head if isinstance(target, HeadKept) else source.head()
        declared = declared_seconds(container, stream, head) if ended else None
        if declared is not None and falls_short(window.seconds, declared):
            raise InputError(
                index, f"is truncated or corrupt: its container declares {declared:.2f} s of audio, "
                f"only {window.seconds:.2f} s decode", path,
            )  # fmt: skip
    if not np.isfinite(window_samples).all():
        raise InputError(index, NONFINITE, path)
    truncated = not ended or window.produced > samples
    return Recording(window_samples, window.seconds, window.produced < samples, truncated, min(window.produced, samples), skipped)
