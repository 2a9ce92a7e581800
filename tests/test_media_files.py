"""File objects as the file verbs (image, video, audio) read them: closed ones, ones that
raise while read, ones that answer a read with fewer bytes than asked; and MP4s whose
sample tables declare more samples than FFmpeg's index should hold."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import media
import media_audio
import numpy as np
import pytest

import uform
from ckpt import make_checkpoint
from uform.plugins.media import mp4

VERBS = ("image_encode", "video_encode", "audio_encode")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> uform.Model:
    path = make_checkpoint(tmp_path_factory.mktemp("files") / "tiny.safetensors", "tiny", 11, ["image", "video", "audio"])
    return uform.Model.load_ram(path, executor=uform.Executor(2), quantization=uform.Scalar.F32)


@pytest.fixture(scope="module")
def items(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """One small valid file for each verb."""
    d = tmp_path_factory.mktemp("media")
    return {
        "image_encode": media.encode_image(media.pattern(48, 64), "PNG"),
        "video_encode": media.clip(frames=6),
        "audio_encode": media_audio.write_format(d, "wav", media_audio.tone(1.5, 44100)).read_bytes(),
    }


def embed(model: uform.Model, verb: str, files: list[Any]) -> np.ndarray:
    return np.array(getattr(model, verb)(files, uform.Arena()).embeddings)


class Trickle(io.RawIOBase):
    """A file object answering every read with at most 3 bytes (a raw stream may), seekable
    or not; after ``fail_at`` bytes its reads raise ``error``."""

    def __init__(self, data: bytes, seekable: bool = True, fail_at: int | None = None, error: Exception | None = None) -> None:
        self.inner, self.can_seek, self.fail_at, self.error = io.BytesIO(data), seekable, fail_at, error

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self.can_seek

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if not self.can_seek:
            raise io.UnsupportedOperation("seek")
        return self.inner.seek(offset, whence)

    def tell(self) -> int:
        return self.inner.tell()

    def readinto(self, buffer: Any) -> int:
        if self.fail_at is not None and self.inner.tell() >= self.fail_at:
            assert self.error is not None
            raise self.error
        data = self.inner.read(min(len(buffer), 3))
        buffer[: len(data)] = data
        return len(data)


@pytest.mark.parametrize("verb", VERBS)
def test_a_closed_file_object_is_refused_by_name(model: uform.Model, items: dict[str, bytes], verb: str, tmp_path: Path) -> None:
    path = tmp_path / "item.bin"
    path.write_bytes(items[verb])
    with open(path, "rb") as f:
        pass
    with pytest.raises(uform.InputError) as caught:
        embed(model, verb, [items[verb], f])
    assert (caught.value.index, caught.value.path, caught.value.reason) == (1, str(path), "the file object is closed")


@pytest.mark.parametrize("verb", ("image_encode", "video_encode"))
def test_a_file_object_raising_while_read_whole_names_the_item(model: uform.Model, items: dict[str, bytes], verb: str) -> None:
    """Images read a one-way stream whole first, video every file object: whatever it raises is the item's error."""
    for seekable in (False, True) if verb == "video_encode" else (False,):
        broken = Trickle(items[verb], seekable=seekable, fail_at=12, error=RuntimeError("the share went away"))
        with pytest.raises(uform.InputError) as caught:
            embed(model, verb, [items[verb], broken])
        assert caught.value.index == 1
        assert caught.value.reason == "cannot read the file object (RuntimeError: the share went away)"


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("seekable", [True, False])
def test_short_reads_give_the_same_embedding(model: uform.Model, items: dict[str, bytes], verb: str, seekable: bool) -> None:
    data = items[verb]
    assert np.array_equal(embed(model, verb, [Trickle(data, seekable)]), embed(model, verb, [data]))


def test_a_seekable_jpeg_read_3_bytes_at_a_time_decodes(model: uform.Model) -> None:
    data = media.encode_image(media.pattern(40, 56), "JPEG")
    assert np.array_equal(embed(model, "image_encode", [Trickle(data)]), embed(model, "image_encode", [data]))


# -- MP4 sample tables ------------------------------------------------------------------------


def test_declared_entries_count_every_sample_of_a_clip() -> None:
    for options in ({}, {"movflags": "faststart"}, {"movflags": "frag_keyframe+empty_moov"}):
        assert mp4.declared_entries(io.BytesIO(media.clip(frames=30, options=options))) == 30
    assert mp4.declared_entries(io.BytesIO(media.mp4_declaring(123_456_789))) == 123_456_789


def test_a_mov_of_uncompressed_audio_counts_its_chunks(tmp_path: Path) -> None:
    """PCM in a MOV declares a sample per sample (2.88 M for a minute at 48 kHz); FFmpeg indexes
    its chunks in pieces of at least 160 samples, and so it is counted: it encodes."""
    path = media_audio.write(tmp_path / "pcm.mov", np.full((1, 48000 * 60), 0.25, np.float32), 48000, "pcm_s16le", "mov")
    with open(path, "rb") as f:
        entries = mp4.declared_entries(f)
    assert 48000 * 60 // 160 <= entries < 48000 * 60 // 100


@pytest.mark.parametrize("verb", ("video_encode", "audio_encode"))
def test_an_mp4_declaring_more_samples_than_the_limit_is_refused_before_ffmpeg_opens_it(
    model: uform.Model, verb: str, tmp_path: Path
) -> None:
    """A 2 KB MP4 declaring 10^7 samples took 0.8 GB and 3 s (6·10^7: 4.2 GB) to be refused as truncated."""
    track = None
    if verb == "audio_encode":
        track = media_audio.write(tmp_path / "tone.m4a", media_audio.tone(1.0, 16000), 16000, "aac", "mp4").read_bytes()
    over = media.mp4_declaring(mp4.MAX_ENTRIES + 1, track)
    path = tmp_path / "over.mp4"
    path.write_bytes(over)
    items: list[tuple[Any, str | None]] = [(over, None), (str(path), str(path)), (io.BytesIO(over), None)]
    if verb == "audio_encode":  # FFmpeg's probe takes these for a MOV as well: a 'junk' box first, an unknown one
        items += [(over[:4] + b"junk" + over[8:], None), (b"\0\0\0\x10\x01\x02\x03\x04" + bytes(8) + over, None)]
    for item, where in items:
        with pytest.raises(uform.InputError) as caught:
            embed(model, verb, [item])
        assert (caught.value.index, caught.value.path) == (0, where)
        assert caught.value.reason == (
            f"its MP4 tables declare {mp4.MAX_ENTRIES + 1} samples, over the limit of {mp4.MAX_ENTRIES} "
            "(uform.plugins.media.mp4.MAX_ENTRIES) that FFmpeg's index is held to"
        )
    assert embed(model, verb, [track or media.clip(frames=10)]).shape == (1, 32)


@pytest.mark.parametrize("verb", ("video_encode", "audio_encode"))
def test_an_mp4_cut_before_its_index_is_whole_is_refused_as_truncated(model: uform.Model, verb: str, tmp_path: Path) -> None:
    """FFmpeg opened an MP4 cut inside its moov box (written last) with what it could read of it:
    a video track without a codec, or none, so a cut recording was refused as 'holds no audio
    stream' and a cut clip as 'in a codec this FFmpeg cannot decode'; cut inside its mdat, before
    the moov, 'Invalid data found when processing input'."""
    if verb == "audio_encode":
        whole = media_audio.write(tmp_path / "tone.m4a", media_audio.tone(1.0, 16000), 16000, "aac", "mp4").read_bytes()
    else:
        whole = media.clip(frames=10)
    moov, mdat = whole.index(b"moov") - 4, whole.index(b"mdat") - 4
    assert mdat < moov  # FFmpeg writes the index last
    cuts = {
        moov + 100: rf"is truncated: it ends 100 bytes into its moov box of \d+, the index of its samples",
        mdat + 20: rf"is truncated: it ends 20 bytes into its mdat box of \d+, before its index \(the moov box\)",
        moov: r"is truncated or corrupt: it has no moov box, the index of its samples",
    }
    for at, reason in cuts.items():
        with pytest.raises(uform.InputError, match=rf"^item 0: {reason}$"):
            embed(model, verb, [whole[:at]])


def test_an_ogg_cut_in_the_packets_ffmpeg_opens_it_with_is_refused_as_such(model: uform.Model, tmp_path: Path) -> None:
    """FFmpeg meets the end of an Ogg Opus file cut a quarter in while it opens it, though its
    headers are whole (they end in its first 1 KB): the reason said 'it ends before its headers do'."""
    whole = media_audio.write_format(tmp_path, "opus-ogg", media_audio.tone(2.0, 48000)).read_bytes()
    with pytest.raises(uform.InputError, match=r"^item 0: is truncated: it ends before FFmpeg has opened it \(inside its headers or the first packets its probe reads\)$"):
        embed(model, "audio_encode", [whole[: len(whole) // 4]])


@pytest.mark.parametrize("lossless", [True, False])
def test_a_cut_webp_is_refused_as_truncated(model: uform.Model, lossless: bool) -> None:
    """libwebp answered every cut WebP 'could not create decoder object'."""
    whole = media.encode_image(media.pattern(48, 64), "WEBP", lossless=lossless)
    assert embed(model, "image_encode", [whole]).shape == (1, 32)
    for eighth in range(1, 8):
        cut = whole[: len(whole) * eighth // 8]
        with pytest.raises(uform.InputError, match=rf"^item 0: the WebP is truncated: its RIFF header declares {len(whole)} bytes, the file holds {len(cut)}$"):
            embed(model, "image_encode", [cut])
