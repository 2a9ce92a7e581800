"""Generated media as file bytes: PNG and JPEG pictures, MP4 and WebM clips, WAV and FLAC audio.

PyAV (FFmpeg) and Pillow only, imported inside the functions. Clips are H.264 (MP4) or VP8
(WebM), 4:2:0, ``VIDEO_FPS`` frames a second; recordings are 16-bit mono at ``SAMPLE_RATE``.
"""

from __future__ import annotations

import io

import numpy as np

from .generate import SAMPLE_RATE, VIDEO_FPS

IMAGE_FORMATS = ("png", "jpeg")
VIDEO_FORMATS = ("mp4", "webm")
AUDIO_FORMATS = ("wav", "flac")


def image_bytes(pixels: np.ndarray, fmt: str = "png", *, quality: int = 95) -> bytes:
    """``uint8 [h, w, 3]`` as a PNG, or a JPEG of ``quality`` (95 unless given)."""
    from PIL import Image

    out = io.BytesIO()
    image = Image.fromarray(np.ascontiguousarray(pixels), "RGB")
    if fmt == "png":
        image.save(out, format="PNG")
    elif fmt == "jpeg":
        image.save(out, format="JPEG", quality=quality)
    else:
        raise ValueError(f"image format must be one of {IMAGE_FORMATS}, got {fmt!r}")
    return out.getvalue()


def video_bytes(frames: np.ndarray, fmt: str = "mp4", *, fps: int = VIDEO_FPS, gop: int | None = None, crf: int | None = None) -> bytes:
    """``uint8 [F, h, w, 3]`` (even ``h`` and ``w``) as H.264 in MP4 or VP8 in WebM, at ``fps``
    frames a second; ``gop`` (keyframe spacing) and ``crf`` (quality) are the encoder's defaults
    (H.264 crf 16, VP8 crf 8) when not given."""
    import av

    if fmt not in VIDEO_FORMATS:
        raise ValueError(f"video format must be one of {VIDEO_FORMATS}, got {fmt!r}")
    out = io.BytesIO()
    # bitexact: no random segment UIDs or dates in the container (WebM bytes then repeat);
    # one encoding thread, no sync-lookahead and x264's cpu-independent make the MP4s repeat too
    # (without cpu-independent about 1 varied training clip in 7 encoded otherwise from one call
    # to the next; mbtree=0 repeated as well)
    with av.open(out, mode="w", format="mp4" if fmt == "mp4" else "webm", options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream("libx264" if fmt == "mp4" else "libvpx", rate=fps)
        stream.width, stream.height = int(frames.shape[2]), int(frames.shape[1])
        stream.pix_fmt = "yuv420p"
        stream.codec_context.thread_count = 1  # PyAV's own default (auto) overrides the "threads" option
        if gop is not None:
            stream.codec_context.gop_size = gop
        if fmt == "mp4":
            stream.options = {"crf": str(16 if crf is None else crf), "preset": "veryfast", "threads": "1", "flags": "+bitexact",
                              "x264-params": "threads=1:lookahead-threads=1:sync-lookahead=0:cpu-independent=1"}  # fmt: skip
        else:
            stream.options = {"crf": str(8 if crf is None else crf), "b": "2M", "threads": "1", "flags": "+bitexact"}
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def audio_bytes(samples: np.ndarray, fmt: str = "wav") -> bytes:
    """int16 mono samples at ``SAMPLE_RATE`` as a WAV (PCM) or FLAC file."""
    if fmt == "wav":
        import wave

        out = io.BytesIO()
        with wave.open(out, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(SAMPLE_RATE)
            w.writeframes(samples.astype("<i2").tobytes())
        return out.getvalue()
    if fmt != "flac":
        raise ValueError(f"audio format must be one of {AUDIO_FORMATS}, got {fmt!r}")
    import av

    out = io.BytesIO()
    with av.open(out, mode="w", format="flac") as container:
        stream = container.add_stream("flac", rate=SAMPLE_RATE, layout="mono")
        stream.format = "s16"
        frame = av.AudioFrame.from_ndarray(samples.astype(np.int16)[None, :], format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()
