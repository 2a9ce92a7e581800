"""Reading and writing the safetensors container without trusting it.

The layout: 8 bytes little-endian header length ``n``, ``n`` bytes of JSON header, then
the data section. Each header entry maps a tensor name to ``dtype``, ``shape`` and
``data_offsets`` (relative to the data section). ``__metadata__`` maps strings to strings.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO, ClassVar

import ml_dtypes
import numpy as np

from . import jsontext
from .errors import CheckpointError, UformError

MAX_HEADER_BYTES = 100 * 1024 * 1024
MAX_HEADER_TOKENS = 1 << 20  # JSON tokens '{', '[', ':', ',' outside strings: about 87,000 tensors of 12 each
MAX_RANK = 8
TOKEN_CHUNK = 1 << 20  # header bytes per step of counting its tokens

DTYPES: dict[str, np.dtype[Any]] = {
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F16": np.dtype(np.float16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "I16": np.dtype(np.int16),
    "I32": np.dtype(np.int32),
    "I64": np.dtype(np.int64),
    "BOOL": np.dtype(np.bool_),
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}

# Floating dtypes: the unsigned view, and the bits of the magnitude at or above which a value
# is NaN or infinite (the exponent all ones). F8_E4M3 has no infinities and one NaN per sign,
# S.1111.111, which the same test catches (0x7F is the largest magnitude).
_NONFINITE: dict[str, tuple[np.dtype[Any], int, int]] = {
    "BF16": (np.dtype(np.uint16), 0x7FFF, 0x7F80),
    "F16": (np.dtype(np.uint16), 0x7FFF, 0x7C00),
    "F32": (np.dtype(np.uint32), 0x7FFFFFFF, 0x7F800000),
    "F64": (np.dtype(np.uint64), 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000),
    "F8_E4M3": (np.dtype(np.uint8), 0x7F, 0x7F),
    "F8_E5M2": (np.dtype(np.uint8), 0x7F, 0x7C),
}
FINITE_CHUNK = 1 << 18  # elements per step of the finiteness check: 512 KiB of BF16, cache-sized


@dataclass(frozen=True)
class Entry:
    """One tensor's header entry, checked against the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Container:
    """A parsed safetensors buffer: metadata, entries, and the data section."""

    metadata: dict[str, str]
    entries: dict[str, Entry]
    data: memoryview
    streams: ClassVar[bool] = False  # every tensor is already in memory: arrays are views

    def nbytes(self, name: str) -> int:
        e = self.entries[name]
        return e.end - e.begin

    def read_into(self, name: str, out: np.ndarray, skip_bf16_check: bool = False) -> np.ndarray:
        """Tensor ``name`` copied into the front of ``out`` (flat uint8), as a typed, shaped view.
        (Nothing is checked here: a parsed buffer is checked whole, :func:`check_finite`.)"""
        e = self.entries[name]
        data = out[: e.end - e.begin]
        data[:] = np.frombuffer(self.data[e.begin : e.end], np.uint8)
        return data.view(DTYPES[e.dtype]).reshape(e.shape)

    def named(self, exc: UformError) -> UformError:
        """``exc`` as it is: a buffer has no name to add."""
        return exc

    def array(self, name: str) -> np.ndarray:
        """A read-only numpy view of a tensor over the buffer (no copy)."""
        e = self.entries[name]
        view = np.frombuffer(self.data[e.begin : e.end], dtype=DTYPES[e.dtype])
        return view.reshape(e.shape)


def _fail(reason: str) -> CheckpointError:
    return CheckpointError(f"not a valid safetensors checkpoint: {reason}")


def parse(buffer: memoryview) -> Container:
    """Parse and check a safetensors buffer; raise :class:`CheckpointError` naming the fault."""
    metadata, entries, start = header(len(buffer), lambda begin, end: bytes(buffer[begin:end]))
    container = Container(metadata, entries, buffer[start:])
    check_finite(container)
    return container


def header(size: int, read: Callable[[int, int], bytes]) -> tuple[dict[str, str], dict[str, Entry], int]:
    """The metadata, the checked entries and the data section's offset of a container of
    ``size`` bytes whose bytes ``[begin, end)`` ``read(begin, end)`` answers. Only the
    header is read; :class:`CheckpointError` names the fault."""
    if size < 8:
        raise _fail(f"{size} bytes is too short for the 8-byte header length")
    first = read(0, 8)
    (header_len,) = struct.unpack("<Q", first)
    if header_len > MAX_HEADER_BYTES:
        raise _fail(f"header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit{_other_format(first)}")
    if 8 + header_len > size:
        raise _fail(f"header length {header_len} runs past the end of the {size}-byte file{_other_format(first)}")
    text = read(8, 8 + header_len)
    tokens = sum(text.count(c) for c in (b"{", b"[", b":", b","))  # strings' too: a bound, counted at C speed
    tokens = json_tokens(text) if tokens > MAX_HEADER_TOKENS else tokens
    if tokens > MAX_HEADER_TOKENS:
        raise _fail(
            f"header holds {tokens} JSON tokens ('{{', '[', ':', ',' outside strings), over the limit of "
            f"{MAX_HEADER_TOKENS}: more than a checkpoint's tensors need"
        )
    try:
        parsed = jsontext.loads(text, unique_keys=True)
    except jsontext.NotJSON as exc:
        raise _fail(f"header is not JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise _fail("header is not a JSON object")
    metadata = parsed.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata  # null is none, as the safetensors library reads it
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise _fail("__metadata__ must map strings to strings")
    data_len = size - 8 - header_len
    entries = {name: _entry(name, raw, data_len) for name, raw in parsed.items()}
    spans = sorted(entries.values(), key=lambda e: (e.begin, e.end))
    for before, after in zip(spans, spans[1:]):
        if after.begin < before.end:
            raise _fail(f"tensors {before.name!r} and {after.name!r} overlap in the data section")
    covered = 0  # the tensors tile the data section, as the format says (no bytes for another reader to find)
    for e in spans:
        if e.begin > covered:
            raise _fail(f"bytes {covered} to {e.begin} of the data section, before tensor {e.name!r}, belong to no tensor")
        covered = e.end
    if covered < data_len:
        raise _fail(f"the last {data_len - covered} bytes of the {data_len}-byte data section belong to no tensor")
    return metadata, entries, 8 + header_len


def json_tokens(text: bytes) -> int:
    """How many ``{``, ``[``, ``:`` and ``,`` the JSON ``text`` holds outside its strings: a bound,
    read without parsing, on the values and keys a parse would make (each costs Python some 50-100
    bytes, so 100 MiB of ``[],[],...`` would cost 2.6 GB). Escaped backslashes and quotes are
    dropped first; every quote left then opens or closes a string."""
    plain = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    count, inside = 0, 0
    for start in range(0, len(plain), TOKEN_CHUNK):
        chunk = np.frombuffer(plain, np.uint8, min(TOKEN_CHUNK, len(plain) - start), start)
        parity = np.bitwise_xor.accumulate((chunk == 0x22).view(np.uint8)) ^ np.uint8(inside)
        structural = (chunk == 0x7B) | (chunk == 0x5B) | (chunk == 0x3A) | (chunk == 0x2C)
        count += int(np.count_nonzero(structural & (parity == 0)))
        inside = int(parity[-1])
    return count


CONVERT = "`uform convert` makes a checkpoint of a model's directory (docs/models.md)"


def _other_format(first: bytes) -> str:
    """What a file whose first 8 bytes are ``first`` is instead, when they say ('' if not)."""
    if first.lstrip()[:1] in (b"{", b"[") and all(32 <= b < 127 or b in b"\t\n\r" for b in first):  # no length is text
        return f"; the file is JSON text (a sharded model's model.safetensors.index.json?), not safetensors: {CONVERT}"
    if first.startswith(b"PK\x03\x04"):
        return f"; the file is a zip archive (PyTorch's pytorch_model.bin?), not safetensors: {CONVERT}"
    return ""


def check_finite(container: Container) -> None:
    """Refuse a floating tensor holding a NaN or an infinity, naming it and the first element
    (:func:`check_tensor` of every tensor, in file order)."""
    scratch: dict[np.dtype[Any], np.ndarray] = {}
    for e in sorted(container.entries.values(), key=lambda e: e.begin):
        check_tensor(e, container.data[e.begin : e.end], scratch)


def check_tensor(e: Entry, data: Any, scratch: dict[np.dtype[Any], np.ndarray] | None = None) -> None:
    """Refuse tensor ``e`` (its bytes: ``data``, any buffer) when it holds a NaN or an infinity.

    Works on the stored bits (an unsigned view: magnitude bits at or above the all-ones
    exponent), in chunks of :data:`FINITE_CHUNK` elements, so nothing is converted and no
    temporary grows with the tensor; ``scratch`` keeps the chunk buffers between calls.
    """
    rule = _NONFINITE.get(e.dtype)
    if rule is None or e.end == e.begin:
        return
    kind, magnitude, limit = rule
    bits = np.frombuffer(data, dtype=kind)
    tmp = (scratch if scratch is not None else {}).setdefault(kind, np.empty(FINITE_CHUNK, kind))
    for start in range(0, len(bits), FINITE_CHUNK):
        chunk = bits[start : start + FINITE_CHUNK]
        part = np.bitwise_and(chunk, kind.type(magnitude), out=tmp[: len(chunk)])
        if part.max() >= limit:
            first = start + int(np.flatnonzero(part >= limit)[0])
            index = tuple(int(i) for i in np.unravel_index(first, e.shape))
            value = np.frombuffer(data, dtype=DTYPES[e.dtype])[first]
            raise CheckpointError(
                f"tensor {e.name!r}: holds NaN or infinite values (the first, {value}, at index {list(index)}); "
                "the weights are corrupt or diverged"
            )


def _entry(name: str, raw: Any, data_len: int) -> Entry:
    if not isinstance(raw, dict):
        raise _fail(f"tensor {name!r}: header entry is not an object")
    dtype, shape, offsets = raw.get("dtype"), raw.get("shape"), raw.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise _fail(f"tensor {name!r}: unknown dtype {dtype!r}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise _fail(f"tensor {name!r}: shape {shape!r} is not a list of at most 8 sizes")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise _fail(f"tensor {name!r}: data_offsets {offsets!r} is not a pair of integers")
    begin, end = offsets
    if not 0 <= begin <= end <= data_len:
        raise _fail(
            f"tensor {name!r}: data_offsets [{begin}, {end}] fall outside the "
            f"{data_len}-byte data section"
        )
    numel = 1
    for d in shape:
        numel *= d
    if (end - begin) != numel * DTYPES[dtype].itemsize:
        raise _fail(
            f"tensor {name!r}: {end - begin} bytes stored but shape {shape} of {dtype} "
            f"needs {numel * DTYPES[dtype].itemsize}"
        )
    return Entry(name, dtype, tuple(shape), begin, end)


def write(
    out: str | os.PathLike[str] | BinaryIO,
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str],
) -> None:
    """Write tensors deterministically: names sorted, header padded to 8 bytes."""
    names = sorted(tensors)
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for name in names:
        arr = tensors[name]
        header[name] = {
            "dtype": DTYPE_NAMES[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    if isinstance(out, (str, os.PathLike)):
        with open(out, "wb") as f:
            _stream(f, blob, (tensors[n] for n in names))
    else:
        _stream(out, blob, (tensors[n] for n in names))


def _stream(f: BinaryIO, blob: bytes, arrays: Iterable[np.ndarray]) -> None:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for arr in arrays:
        f.write(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
