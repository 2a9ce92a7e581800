"""Content parts to media bytes: ``data:`` URLs, ``file://`` URLs inside ``--media-root``.

A part is OpenAI's ``{"type": "image_url", "image_url": {"url": ...}}``, ``{"type":
"input_audio", "input_audio": {"data": <base64>, "format": "wav"}}``, vLLM's ``video_url``
and ``audio_url``, or ``{"type": "text", "text": ...}``. Remote URLs are refused: the
server fetches nothing. Every failure is a ``ValueError`` whose message is the reason.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from .errors import shown as shown_value

# part type -> (the item's modality, the key holding its object)
PART_TYPES = {"image_url": "image", "video_url": "video", "audio_url": "audio", "input_audio": "audio"}
AUDIO_FORMATS = {"wav", "mp3", "flac", "opus", "ogg", "oga", "webm", "m4a"}


def part_bytes(part: dict[str, Any], media_root: Path | None, limit: int) -> tuple[str, bytes]:
    """``(modality, file bytes)`` of one media content part."""
    kind = part.get("type")
    if not isinstance(kind, str) or kind not in PART_TYPES:
        raise ValueError(f"unknown content part type {shown_value(kind)} (expected text, image_url, video_url, audio_url or input_audio)")
    modality = PART_TYPES[kind]
    body = part.get(kind)
    if kind == "input_audio":
        if not isinstance(body, dict) or not isinstance(body.get("data"), str):
            raise ValueError("input_audio needs an object with 'data', the recording's bytes in base64")
        fmt = body.get("format")
        if fmt is not None and (not isinstance(fmt, str) or fmt.lower() not in AUDIO_FORMATS):
            raise ValueError(f"input_audio format {shown_value(fmt)} is not one of {', '.join(sorted(AUDIO_FORMATS))}")
        return modality, b64(body["data"])
    url = body.get("url") if isinstance(body, dict) else body
    if not isinstance(url, str):
        raise ValueError(f"{kind} needs {{\"url\": ...}}, a data: URL" + (" or a file:// URL" if media_root else ""))
    return modality, url_bytes(url, modality, media_root, limit)


def b64(text: str) -> bytes:
    """Strict base64 (whitespace and a missing padding are tolerated, nothing else)."""
    try:  # as clients send it, whole: no copy of the text without its whitespace
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        cleaned = "".join(text.split())
        try:
            data = base64.b64decode(cleaned + "=" * (-len(cleaned) % 4), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"bad base64 ({exc})") from None
    if not data:
        raise ValueError("the media is empty")
    return data


def url_bytes(url: str, modality: str, media_root: Path | None, limit: int) -> bytes:
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        head, sep, payload = url[5:].partition(",")
        if not sep or not head.lower().endswith(";base64"):
            raise ValueError("a data: URL must be base64 (data:<type>;base64,<data>)")
        mime = head[: -len(";base64")].split(";")[0].strip().lower()
        if mime and mime != "application/octet-stream" and not mime.startswith(modality + "/"):
            raise ValueError(f"a data: URL of type {mime!r} given as {modality}")
        return b64(payload)
    if scheme in ("http", "https"):
        raise ValueError(f"remote URLs are refused ({scheme}://...): this server fetches nothing; send the bytes as a data: URL")
    if scheme == "file":
        if media_root is None:
            raise ValueError("file:// URLs are refused: the server was started without --media-root")
        return read_under(file_path(url), media_root, limit)
    raise ValueError(f"unsupported URL scheme {scheme!r} (expected data:" + (" or file://" if media_root else "") + ")")


def file_path(url: str) -> str:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"a file:// URL names host {parts.netloc!r}: only local paths are served")
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise ValueError("a file:// URL needs an absolute path (file:///srv/media/cat.jpg)")
    return path


def shown(path: str) -> str:
    """``path`` as a message can carry it: a byte that is not UTF-8 (a surrogate escape, U+DC80)
    written as its escape, ``\\x80``; any other lone surrogate as ``\\ud800``, a control
    character (a newline, NUL) as ``\\n``, ``\\x00``: one printable line."""
    if path.isprintable():  # no surrogate, no control character
        return path
    return "".join(c if c.isprintable() else f"\\x{ord(c) - 0xDC00:02x}" if "\udc80" <= c <= "\udcff" else c.encode("unicode_escape").decode()
                   for c in path)  # fmt: skip


def read_under(path: str, media_root: Path, limit: int) -> bytes:
    """The bytes of ``path`` if it resolves (symbolic links followed) inside ``media_root``."""
    if "\x00" in path:
        raise ValueError(f"{shown(path)} is not a file name: it holds a NUL byte")
    try:
        os.fsencode(path)
    except UnicodeEncodeError:
        raise ValueError(f"{shown(path)} is not a file name: a lone surrogate stands for no byte") from None
    try:
        return _read_under(path, media_root, limit)
    except ValueError as exc:
        if path == shown(path):
            raise
        raise ValueError(str(exc).replace(path, shown(path))) from None
    except OSError as exc:  # a name the file system cannot take (a NUL byte, a lone surrogate)
        raise ValueError(f"cannot read {shown(path)} ({exc.strerror or exc})") from None


def _read_under(path: str, media_root: Path, limit: int) -> bytes:
    root = os.path.realpath(media_root)
    real = os.path.realpath(path)
    if os.path.commonpath([root, real]) != root:
        raise ValueError(f"{path} is outside the media root (symbolic links are resolved first)")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ValueError(f"no such file {path} under the media root") from None
    except OSError as exc:
        raise ValueError(f"cannot read {path} ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if info.st_size > limit:
            raise ValueError(f"{path} holds {info.st_size} bytes, over the limit of {limit}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if not data:
        raise ValueError(f"{path} is empty")
    return data
