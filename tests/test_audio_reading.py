"""What audio_encode sees of good recordings, against a reference read of the same file: every
PCM WAV format scaled and mixed as docs/checkpoint.md says, codecs' delay and padding removed
(gapless), resampling against the analytic signal, the window's edges.

``python tests/test_audio_reading.py`` prints the resampling table docs/media-reading.md quotes.
"""

from __future__ import annotations

import io
import struct
import sys
from fractions import Fraction

import av
import numpy as np
import pytest

from uform.core.errors import InputError
from uform.plugins.media import audio, files
from uform.plugins.media import window as window_module

RATES = (8000, 11025, 22050, 32000, 44100, 48000, 96000, 192000)


def encoded(signal: np.ndarray, rate: int, codec: str, fmt: str, options: dict[str, str] | None = None) -> bytes:
    """``signal`` [channels, n] (float, -1…1) encoded by PyAV; 1, 2 or 6 (5.1) channels."""
    layout = {1: "mono", 2: "stereo", 6: "5.1"}[signal.shape[0]]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        stream.codec_context.options = options or {}
        for start in range(0, signal.shape[1], 1000):
            part = np.ascontiguousarray(signal[:, start : start + 1000], np.float32)
            frame = av.AudioFrame.from_ndarray(part, format="fltp", layout=layout)
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def window(data: bytes, rate: int, samples: int) -> audio.Recording:
    return audio.decode(files.Source(0, None, data=data), rate, samples)


def wav_samples(data: bytes, codec: str) -> np.ndarray:
    """The WAV's ``data`` chunk read by hand, scaled to -1…1 as docs/checkpoint.md says: float64
    [n, channels]. G.711 expands by its tables (ITU-T G.711), as 16-bit samples."""
    channels = struct.unpack("<H", data[data.find(b"fmt ") + 10 :][:2])[0]
    at = data.find(b"data")
    raw = data[at + 8 : at + 8 + struct.unpack("<I", data[at + 4 : at + 8])[0]]
    if codec == "pcm_s24le":
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int64)
        v = b[:, 0] | b[:, 1] << 8 | b[:, 2] << 16
        x = (v - (v >= 1 << 23) * (1 << 24)) / 2**23  # s24 as FFmpeg gives it (s32, shifted up 8) / 2^31
    elif codec in ("pcm_mulaw", "pcm_alaw"):
        u = np.frombuffer(raw, np.uint8).astype(np.int64)
        if codec == "pcm_mulaw":
            u = ~u & 0xFF
            v = (((u & 0xF) << 3) + 0x84 << (u >> 4 & 7)) - 0x84
            x = np.where(u & 0x80, -v, v) / 32768
        else:
            u ^= 0x55
            e, m = u >> 4 & 7, u & 0xF
            v = np.where(e == 0, (m << 4) + 8, ((m << 4) + 0x108) << np.maximum(e - 1, 0))
            x = np.where(u & 0x80, v, -v) / 32768
    else:
        dtype, offset, scale = {"pcm_u8": ("u1", 128, 1 / 128), "pcm_s16le": ("<i2", 0, 1 / 32768), "pcm_s32le": ("<i4", 0, 1 / 2**31),
                                "pcm_f32le": ("<f4", 0, 1.0), "pcm_f64le": ("<f8", 0, 1.0)}[codec]  # fmt: skip
        x = (np.frombuffer(raw, dtype).astype(np.float64) - offset) * scale
    return x.reshape(-1, channels)


@pytest.mark.parametrize("codec", ["pcm_u8", "pcm_s16le", "pcm_s24le", "pcm_s32le", "pcm_f32le", "pcm_f64le", "pcm_mulaw", "pcm_alaw"])
@pytest.mark.parametrize("channels", [1, 2, 6])
def test_every_pcm_wav_is_its_samples_scaled_and_mixed_as_the_mean(codec: str, channels: int) -> None:
    # at the tower's rate (nothing resampled); 6 channels is 5.1 in WAVE_FORMAT_EXTENSIBLE (so is
    # every 24- and 32-bit integer file), its LFE counted as any channel; ±1 and 0.999 included
    rng = np.random.default_rng(0)
    signal = np.clip(rng.normal(0, 0.3, (channels, 4000)), -1, 1)
    signal[:, 10:13] = [[1.0, -1.0, 0.999]] * channels
    data = encoded(signal, 16000, codec, "wav")
    assert struct.unpack("<H", data[data.find(b"fmt ") + 8 :][:2])[0] == (0xFFFE if channels == 6 or codec in ("pcm_s24le", "pcm_s32le") else
                                                                         {"pcm_f32le": 3, "pcm_f64le": 3, "pcm_mulaw": 7, "pcm_alaw": 6}.get(codec, 1))  # fmt: skip
    recording = window(data, 16000, 4005)
    reference = wav_samples(data, codec).mean(axis=1)
    np.testing.assert_allclose(recording.samples[:4000], reference, rtol=0, atol=6e-8)  # float32's rounding of the mean
    assert recording.padded and not recording.samples[4000:].any()


def noise(n: int, rate: int, seed: int = 1) -> np.ndarray:
    """Noise under 4 kHz that fades in over 2000 samples: a lossy codec keeps its shape."""
    from scipy import signal as filters

    b, a = filters.butter(4, 4000 / (rate / 2))
    x = filters.lfilter(b, a, np.random.default_rng(seed).normal(0, 0.3, n)).astype(np.float32)
    x[:2000] *= np.linspace(0, 1, 2000, dtype=np.float32)
    return x


def lag(got: np.ndarray, reference: np.ndarray, most: int = 2048) -> int:
    """Where ``reference`` best lines up in ``got`` (a positive lag: ``got`` starts later)."""
    a, b = got[: 8192 + 2 * most].astype(np.float64), reference[: 8192].astype(np.float64)
    scores = [np.dot(a[most + k : most + k + 8192] if k >= -most else a, b) for k in range(-most, most + 1)]
    return int(np.argmax(scores)) - most


@pytest.mark.parametrize(("codec", "fmt", "rate", "extra"), [
    ("libmp3lame", "mp3", 44100, 0),  # LAME's Info tag: encoder delay and padding
    ("libopus", "webm", 48000, 0),  # CodecDelay and DiscardPadding
    ("libopus", "ogg", 48000, 312),  # pre-skip; this muxer's last granule position counts the pre-skip twice
    ("flac", "flac", 44100, 0),
])  # fmt: skip
def test_codecs_delay_and_padding_are_removed(codec: str, fmt: str, rate: int, extra: int) -> None:
    pytest.importorskip("scipy")
    n = 30011
    x = noise(n, rate)
    recording = window(encoded(x[None], rate, codec, fmt), rate, n + 4000)
    assert lag(np.pad(recording.samples, (2048, 0)), x) == 0  # the first sample where it was: gapless
    assert round(recording.seconds * rate) == n + extra
    if codec == "flac":
        step = recording.samples[:n] * 32768  # lossless: 16-bit samples (FFmpeg's encoder), within a step of the input
        assert (step == np.round(step)).all() and np.abs(recording.samples[:n] - x).max() <= 1 / 32768
        for blocks in ("17", "1001"):  # odd block sizes: the same samples
            odd = window(encoded(x[None], rate, codec, fmt, {"frame_size": blocks}), rate, n + 4000)
            np.testing.assert_array_equal(odd.samples, recording.samples)


def test_aac_priming_is_removed_where_an_edit_list_declares_it() -> None:
    # AAC starts with 1024 samples of encoder delay. An M4A whose edit list starts at 1024 (as
    # FFmpeg's own muxer and Apple's write one) is read from the first real sample; one that
    # declares nothing (PyAV's muxer writes media_time 0; an ADTS stream has nowhere to say it)
    # keeps the 1024 samples in front: FFmpeg decodes them, uform with it.
    pytest.importorskip("scipy")
    n = 30011
    x = noise(n, 44100)
    data = encoded(x[None], 44100, "aac", "mp4")
    at = data.find(b"elst")
    assert struct.unpack(">Ii", data[at + 12 : at + 20])[1] == 0
    assert lag(np.pad(window(data, 44100, n).samples, (2048, 0)), x) == 1024
    edited = data[: at + 12] + struct.pack(">Ii", n * 1000 // 44100, 1024) + data[at + 20 :]
    assert lag(np.pad(window(edited, 44100, n).samples, (2048, 0)), x) == 0



def test_an_mp3_without_lames_info_tag_keeps_the_codecs_delay() -> None:
    # the Info frame (the file's first, after its ID3 tag) is where LAME says its delay: without
    # it FFmpeg decodes the 576 samples of encoder delay and 529 of decoder delay, 25 ms in front
    pytest.importorskip("scipy")
    n = 30011
    x = noise(n, 44100)
    data = encoded(x[None], 44100, "libmp3lame", "mp3")
    assert data[:3] == b"ID3" and data.find(b"Info") > 0
    start = 10 + (data[6] << 21 | data[7] << 14 | data[8] << 7 | data[9])
    second = next(k for k in range(start + 1, len(data) - 1) if data[k] == 0xFF and data[k + 1] & 0xE0 == 0xE0)
    untagged = window(data[:start] + data[second:], 44100, n + 4000)
    assert lag(np.pad(untagged.samples, (2048, 0)), x) == 1105 and round(untagged.seconds * 44100) == 32256  # 28 frames of 1152

def resampling_errors(rate: int, tower_rate: int = 16000, samples: int = 16000) -> dict[float, float]:
    """Largest |window − the analytic sine| past the first and last 64 samples, for sines of
    amplitude 0.5 at 1/8, 3/8, 3/4 and 15/16 of the lower Nyquist frequency."""
    nyquist = min(rate, tower_rate) / 2
    out = {}
    for share in (0.125, 0.375, 0.75, 0.9375):
        f = share * nyquist
        x = (0.5 * np.sin(2 * np.pi * f * np.arange(int(rate * 1.2)) / rate + 0.3)).astype(np.float32)
        y = window_module.resample(0, x, rate, tower_rate, samples).samples
        exact = 0.5 * np.sin(2 * np.pi * f * np.arange(samples) / tower_rate + 0.3)
        out[share] = float(np.abs(y - exact)[64:-64].max())
    return out


@pytest.mark.parametrize("rate", RATES)
def test_resampling_is_within_the_stated_bound_of_the_analytic_signal(rate: int) -> None:
    errors = resampling_errors(rate)
    assert max(errors[0.125], errors[0.375], errors[0.75]) < 3e-5, errors  # flat to 3/4 of Nyquist, no delay
    assert 0.13 < errors[0.9375] < 0.15, errors  # 15/16 of Nyquist: about 29 % of 0.5 lost (the filter's cutoff, 0.97, rolls off from there)
    dc = window_module.resample(0, np.full(rate * 6 // 5, 0.25, np.float32), rate, 16000, 16000).samples
    assert np.abs(dc - 0.25).max() < 3e-6  # a DC offset kept, from the first sample
    square = window_module.resample(0, np.sign(np.sin(2 * np.pi * 440 * np.arange(rate * 6 // 5) / rate)).astype(np.float32), rate, 16000, 16000).samples
    assert 1.1 < square.max() < 1.3  # a full-scale square wave overshoots ±1 (Gibbs): the window may leave -1…1


@pytest.mark.parametrize(("rate", "n", "padded", "truncated"), [
    (8000, 7999, True, False), (8000, 8000, False, False), (8000, 8001, False, True),
    (44100, 44099, False, False), (44100, 44100, False, False), (44100, 44101, False, False), (44100, 44102, False, True),
])  # fmt: skip
def test_padded_and_truncated_are_judged_on_the_resampled_length(rate: int, n: int, padded: bool, truncated: bool) -> None:
    # the resampled length is n R / rate rounded half up: 44,099 and 44,101 samples at 44.1 kHz
    # are both 16,000 at 16 kHz, exactly the window; 44,102 are 16,000.7, one sample past it
    x = (0.5 * np.sin(2 * np.pi * 440 * np.arange(n) / rate)).astype(np.float32)
    recording = window(encoded(x[None], rate, "pcm_s16le", "wav"), 16000, 16000)
    assert (recording.padded, recording.truncated) == (padded, truncated)
    buffer = window_module.resample(0, x, rate, 16000, 16000)
    assert (buffer.padded, buffer.truncated) == (padded, truncated)
    assert int(np.flatnonzero(recording.samples)[-1]) + 1 == min(16000, (n * 16000 + rate // 2) // rate)


def tracks(fmt: str, codec: str, dispositions: tuple[int, ...] | None, seconds: tuple[float, ...] = (1.0, 1.0)) -> bytes:
    """Audio streams at 16 kHz, mono, each a 440 Hz sine of its own amplitude (0.25, 0.5, 0.125) for its ``seconds``,
    with ``dispositions`` set (an MP4's enabled track, Matroska's FlagDefault; None: the muxer's choice)."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=fmt) as out:
        streams = [out.add_stream(codec, rate=16000, layout="mono") for _ in seconds]
        for k, stream in enumerate(streams):
            if dispositions is not None:
                stream.disposition = av.stream.Disposition(dispositions[k])
        for k, (stream, length) in enumerate(zip(streams, seconds)):
            signal = ((0.25, 0.5, 0.125)[k] * np.sin(2 * np.pi * 440 * np.arange(int(16000 * length)) / 16000))[None].astype(np.float32)
            for start in range(0, signal.shape[1], 1000):
                frame = av.AudioFrame.from_ndarray(signal[:, start : start + 1000], format="fltp", layout="mono")
                frame.sample_rate, frame.pts = 16000, start
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)
    return buffer.getvalue()


def test_of_two_audio_streams_the_one_marked_default_is_read() -> None:
    # uform read the first audio stream, whichever a player plays: a film's commentary first and
    # its main track marked default gave the commentary. FFmpeg's best stream (av_find_best_stream,
    # which torchcodec, so transformers' load_audio, takes, as video_encode does) is the one marked
    # default, and one for the visually or hearing impaired after the others.
    default, none, impaired = 1, 0, 1 | 256  # AV_DISPOSITION_DEFAULT, AV_DISPOSITION_VISUAL_IMPAIRED
    comment = 8  # AV_DISPOSITION_COMMENT: FFmpeg's best stream does not weigh it
    for fmt, codec in (("matroska", "flac"), ("mp4", "aac"), ("webm", "libopus")):
        cases = [(None, 0.25), ((default, none), 0.25), ((none, default), 0.5), ((comment, default), 0.5)]
        cases += [((impaired, default), 0.5)] if fmt != "webm" else []  # WebM stores no FlagVisualImpaired: both default, the first
        for dispositions, amplitude in cases:
            data = tracks(fmt, codec, dispositions)
            with av.open(io.BytesIO(data)) as container:
                best = container.streams.best("audio").index
            got = window(data, 16000, 16000).samples[4000:12000]
            assert abs(float(np.sqrt(np.mean(got**2))) * np.sqrt(2) - amplitude) < 0.01, (fmt, dispositions, best)
            assert best == (amplitude == 0.5), (fmt, dispositions)


def test_a_stream_shorter_than_the_file_is_judged_by_its_own_length() -> None:
    # a Matroska track states no duration of its own to FFmpeg but the DURATION tag FFmpeg and
    # mkvmerge write; the file's (the longest stream's) was taken for the audio's, so a default
    # track of 1 s beside a 3 s one (or a 3 s video) was refused as cut short.
    for fmt, codec in (("matroska", "flac"), ("webm", "libopus")):
        data = tracks(fmt, codec, (1, 0), (1.0, 3.0))
        read = window(data, 16000, 80000)
        assert (round(read.seconds, 3), read.padded, read.truncated) == (1.0, True, False), fmt
        whole = tracks(fmt, codec, (1, 0), (3.0, 3.0))  # cut, it is still refused: the tag is in its head
        with pytest.raises(InputError, match=r"item 0: is truncated or corrupt: its container declares 3.0\d s of audio, only 1.\d\d s decode"):
            window(whole[: int(len(whole) * 0.4)], 16000, 80000)


def test_an_audio_file_attached_to_a_matroska_is_named_not_read() -> None:
    # a Matroska attachment is a file stored whole (fonts, covers, a soundtrack), not a stream:
    # no player plays it, torchcodec finds no audio stream either. A video with a FLAC attached
    # was refused as 'holds no audio stream', which did not say why a file with sound in it has none.
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="matroska") as out:
        out.add_attachment("song.flac", "audio/flac", tracks("flac", "flac", None, (1.0,)))
        stream = out.add_stream("libvpx-vp9", rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for i in range(5):
            frame = av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    with pytest.raises(InputError) as caught:
        window(buffer.getvalue(), 16000, 16000)
    assert str(caught.value) == (
        "item 0: holds no audio stream (streams: video); the files attached to it (song.flac (audio/flac)) are not read: "
        'extract one first (ffmpeg -dump_attachment:t "" -i FILE writes each under its own name)'
    )


def test_an_audio_stream_beside_a_timed_text_track_is_read_as_alone() -> None:
    # an MP4 with a subtitle (mov_text, 3GPP timed text) track beside its sound: the text's
    # packets are not demuxed, the window is the same as the file without it, to the bit
    def mp4(text: bool) -> bytes:
        buffer = io.BytesIO()
        with av.open(buffer, "w", format="mp4") as out:
            stream = out.add_stream("aac", rate=16000, layout="mono")
            cues = out.add_mux_stream("mov_text") if text else None
            signal = (0.5 * np.sin(2 * np.pi * 440 * np.arange(32000) / 16000))[None].astype(np.float32)
            for start in range(0, 32000, 1024):
                frame = av.AudioFrame.from_ndarray(signal[:, start : start + 1024], format="fltp", layout="mono")
                frame.sample_rate, frame.pts = 16000, start
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)
            for k, words in enumerate((b"hello", b"world") if cues is not None else ()):
                cue = av.Packet(len(words).to_bytes(2, "big") + words)
                cue.stream, cue.time_base, cue.pts, cue.dts, cue.duration = cues, Fraction(1, 1000), 500 + 1000 * k, 500 + 1000 * k, 800
                out.mux(cue)
        return buffer.getvalue()

    with_text, alone = mp4(True), mp4(False)
    with av.open(io.BytesIO(with_text)) as container:
        assert [(s.type, s.codec_context.name) for s in container.streams] == [("audio", "aac"), ("subtitle", "mov_text")]
    got, want = window(with_text, 16000, 48000), window(alone, 16000, 48000)
    np.testing.assert_array_equal(got.samples, want.samples)
    assert (got.seconds, got.padded, got.truncated) == (want.seconds, True, False)


def test_an_only_audio_stream_that_never_decodes_is_refused_with_its_count() -> None:
    # every packet of the file's one audio stream replaced by noise of its size (a damaged copy):
    # refused, the packets that failed counted as PyAV's own decode counts them; past
    # MAX_FAILED_PACKETS in a row, by that reason. Nothing hangs; Opus decodes noise as sound.
    rng = np.random.default_rng(5)
    for fmt, codec, seconds in (("matroska", "flac", 1.0), ("mp4", "aac", 1.0), ("matroska", "flac", 10.0)):
        source, noisy = tracks(fmt, codec, None, (seconds,)), io.BytesIO()
        with av.open(io.BytesIO(source)) as read, av.open(noisy, "w", format=fmt) as out:
            stream = out.add_stream_from_template(read.streams.audio[0])
            for packet in read.demux(read.streams.audio[0]):
                if packet.size:
                    garbage = av.Packet(rng.bytes(packet.size))
                    garbage.stream, garbage.time_base, garbage.pts, garbage.dts = stream, packet.time_base, packet.pts, packet.dts
                    out.mux(garbage)
        failed = 0
        with av.open(io.BytesIO(noisy.getvalue())) as read:
            for packet in read.demux(read.streams.audio[0]):
                try:
                    packet.decode()
                except av.FFmpegError:
                    failed += 1
        reason = f"holds no decodable audio ({failed} packets failed to decode)"
        if failed > audio.MAX_FAILED_PACKETS:
            reason = f"is corrupt: {audio.MAX_FAILED_PACKETS + 1} packets in a row fail to decode"
        with pytest.raises(InputError) as caught:
            window(noisy.getvalue(), 16000, 16000 * 12)
        assert (caught.value.reason, failed > 10) == (reason, True), (fmt, codec, seconds)


def test_a_default_stream_ffmpeg_cannot_decode_gives_way_to_one_it_can() -> None:
    # the default track in a codec this FFmpeg has no decoder for (its Matroska codec id renamed),
    # a FLAC track beside it: FFmpeg's best stream is the undecodable one (PyAV asks it without a
    # decoder); torchcodec, asking with one, passes it over, and so does uform (it refused the file)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="matroska") as out:
        streams = [out.add_stream("libopus", rate=48000, layout="mono"), out.add_stream("flac", rate=16000, layout="mono")]
        streams[0].disposition, streams[1].disposition = av.stream.Disposition.default, av.stream.Disposition(0)
        for stream, amplitude in zip(streams, (0.25, 0.5)):
            signal = (amplitude * np.sin(2 * np.pi * 440 * np.arange(stream.rate) / stream.rate))[None].astype(np.float32)
            for start in range(0, stream.rate, 960):
                frame = av.AudioFrame.from_ndarray(signal[:, start : start + 960], format="fltp", layout="mono")
                frame.sample_rate, frame.pts = stream.rate, start
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)
    data = buffer.getvalue()
    assert data.count(b"A_OPUS") == 1
    data = data.replace(b"A_OPUS", b"A_XYZS")
    with av.open(io.BytesIO(data)) as container:
        assert [(s.codec_context is None, int(s.disposition)) for s in container.streams.audio] == [(True, 1), (False, 0)]
        assert container.streams.best("audio").index == 0
    got = window(data, 16000, 16000).samples[4000:12000]
    assert abs(float(np.sqrt(np.mean(got**2))) * np.sqrt(2) - 0.5) < 0.01


if __name__ == "__main__":
    print("rate    1/8 Nyq   3/8 Nyq   3/4 Nyq   15/16 Nyq  (largest |error|, sine of amplitude 0.5, into 16 kHz)")
    for rate in RATES if len(sys.argv) < 2 else [int(a) for a in sys.argv[1:]]:
        errors = resampling_errors(rate)
        print(f"{rate:6d}  " + "  ".join(f"{errors[s]:.1e}" for s in (0.125, 0.375, 0.75, 0.9375)))
