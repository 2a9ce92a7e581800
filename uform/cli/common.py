"""What the commands share: progress bars, loading the model, the options every command takes,
and how a name (a file's path, a text) is printed: :func:`printable`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from uform import Model
    from uform.core.progress import ProgressHandler
    from uform.inputs import Failure

QUANTIZATIONS = ("bf16", "e4m3", "f32")


def bars_enabled(quiet: bool) -> bool:
    """Progress bars are drawn on stderr when it is a terminal and ``--quiet`` was not given."""
    if quiet:
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except (OSError, ValueError):  # a closed or detached stream
        return False


class Bar:
    """A tqdm bar on stderr that the API's ``progress(done, total)`` callbacks move.

    ``handler(offset)`` answers a callback that sets the bar to ``offset + done``: a command that
    makes several calls (one per modality, say) gives each call the items done before it. The
    bar never moves back (a call retried after a bad item restarts its count). Nothing is drawn
    when bars are off (``bars_enabled``), and the handlers never cancel.
    """

    def __init__(self, desc: str, *, quiet: bool, total: int | None = None, unit: str = "item", bytes_: bool = False) -> None:
        self._bar: Any = None
        self._fixed_total = total is not None
        if bars_enabled(quiet):
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, desc=desc, unit="B" if bytes_ else unit, unit_scale=bytes_, unit_divisor=1024 if bytes_ else 1000,
                file=sys.stderr, leave=False, dynamic_ncols=True,
            )  # fmt: skip

    @property
    def drawn(self) -> bool:
        return self._bar is not None

    def to(self, n: int, total: int | None = None) -> None:
        bar = self._bar
        if bar is None:
            return
        if total is not None and not self._fixed_total and bar.total != total:
            bar.total = total
        if n > bar.n:
            bar.update(n - bar.n)

    def handler(self, offset: int = 0) -> ProgressHandler:
        def progress(done: int, total: int) -> None:
            self.to(offset + done, None if self._fixed_total else offset + total)

        return progress

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="draw no progress bars (they are drawn on stderr only when it is a terminal)")


def add_force(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--force", action="store_true", help=f"replace {what} (refused without it)")


def checkpoint_path(value: str) -> str:
    """``--model``'s value: any path but the empty one (which ``Path`` reads as the current folder)."""
    if not value:
        raise argparse.ArgumentTypeError("the checkpoint path is empty")
    return value


def add_model(p: argparse.ArgumentParser, *, quantization: bool = True) -> None:
    """``--model PATH`` (default: the checkpoint shipped with uform) and ``--quantization``."""
    p.add_argument("-m", "--model", type=checkpoint_path, default=None, metavar="PATH", help="checkpoint to load (default: the model shipped with uform, uform.default_checkpoint())")
    if quantization:
        p.add_argument(
            "--quantization", choices=QUANTIZATIONS, default="bf16",
            help="the scalar the transformer's weights are held in: bf16 as stored (default), e4m3 quantized at load, f32 widened",
        )  # fmt: skip
    add_quiet(p)


def model_path(args: argparse.Namespace) -> Path:
    """The checkpoint a command uses: ``--model``, else the default checkpoint."""
    from uform import default_checkpoint

    return Path(args.model) if args.model is not None else default_checkpoint()


def load(args: argparse.Namespace) -> Model:
    """The model of ``--model`` (or the default) in RAM, at ``--quantization``, with a loading bar."""
    from uform import Model, Scalar

    path = model_path(args)
    with Bar(f"loading {path.name}", quiet=args.quiet, bytes_=True) as bar:
        return Model.load_ram(path, quantization=Scalar(getattr(args, "quantization", "bf16")), progress=bar.handler())


def say(message: str) -> None:
    """A line for the user on stderr (failed inputs, notes), apart from the results on stdout."""
    print(message, file=sys.stderr)


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def from_here(path: str) -> str:
    """An absolute ``path`` as it opens from the current folder: relative to it where it lies
    under it (``photos/p2.png`` beside ``photos/``), else as it is (absolute)."""
    here = os.getcwd() + os.sep
    return path[len(here) :] if path.startswith(here) else path


def printable(name: str) -> str:
    """``name`` (a path, a text) as one printable line, the same on stdout, stderr and in JSON:
    a backslash doubled, a byte that was not UTF-8 (Python's surrogate escape of a file name)
    as ``\\xNN`` (NN from 80), newline, carriage return and tab as ``\\n``, ``\\r``, ``\\t``, any
    other character that is not printable as ``\\xNN`` (below 80), ``\\uNNNN`` or ``\\UNNNNNNNN``; every other
    character as it is. Two different names never print the same."""
    if name.isprintable() and "\\" not in name:
        return name
    out = []
    for ch in name:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's escape of the undecodable byte code - 0xDC00
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)


def failed(f: Failure) -> str:
    """The stderr line of a failed input: ``uform: failed: KIND NAME: REASON``, the name printable
    (a text quoted), the reason on the same line."""
    what = f"'{printable(f.value)}'" if f.kind == "text" else printable(f.value)
    return f"uform: failed: {f.kind} {what}: {printable(f.reason)}"
