"""What ``uform encode --out OUT`` writes, named: the set's files (``OUT.npy``,
``OUT.scales.npy`` for I8, ``OUT.jsonl``, the manifest ``OUT.json``), the manifest's format and
the scalars it may say, each member's SHA-256, and names that are not UTF-8 as JSON holds them.
Writing a set is :mod:`uform.cli.saved`, reading one back :mod:`uform.cli.readback`."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from .common import printable
from uform.items import value_key

FORMAT = "uform-embeddings/1"
SCALARS = ("f32", "f16", "bf16", "e4m3", "e5m2", "i8", "b1")
# .npy has no BF16 or FP8 dtypes (numpy reads them back as opaque void): their bits are saved
BITS = {"bf16": np.uint16, "e4m3": np.uint8, "e5m2": np.uint8}
SUFFIXES = (".npy", ".jsonl", ".json")
MEMBERS = ("npy", "index", "scales")  # the manifest's fields that name the set's other files


def sha256(path: str | os.PathLike[str]) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def members(prefix: Path, scales: bool) -> list[Path]:
    """The files of the output at ``prefix``, in the order they are put in place (manifest last)."""
    return [Path(f"{prefix}.npy")] + ([Path(f"{prefix}.scales.npy")] if scales else []) + [Path(f"{prefix}.jsonl"), Path(f"{prefix}.json")]


def json_name(name: str) -> str:
    """``name`` as a JSON key: itself, or as it prints when it is not UTF-8 (:func:`json_record`)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return printable(name)
    return name


def json_record(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as valid UTF-8 JSON can hold it: a string that is not UTF-8 (a file name's bytes
    that are not, which Python holds as lone surrogates) is written as it prints
    (:func:`~uform.cli.common.printable`: ``r\\xffd.png``), and its exact bytes as hex beside it
    under the key ``KEY_hex`` (``"path_hex": "72ff642e706e67"``), which :func:`record_name` reads back."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                out[key], out[f"{key}_hex"] = printable(value), value.encode("utf-8", "surrogateescape").hex()
                continue
        out[key] = value
    return out


def record_name(row: dict[str, Any], key: str, where: str) -> str | None:
    """The name ``row[key]`` as the file system gives it: from ``KEY_hex`` where :func:`json_record`
    wrote one (a name that is not UTF-8), else the string itself; None when neither is a string."""
    exact = row.get(f"{key}_hex")
    if exact is None:
        value = row.get(key)
        return value if isinstance(value, str) else None
    try:
        return bytes.fromhex(exact).decode("utf-8", "surrogateescape") if isinstance(exact, str) else None
    except ValueError:
        raise ValueError(f"{where}: {key}_hex is not hex digits") from None


def row_key(row: dict[str, Any]) -> str:
    """Which field of an index row holds what it is: ``text`` for a text, else ``path``."""
    return value_key(row.get("kind"))
