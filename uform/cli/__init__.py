"""The ``uform`` command: encode and search media, evaluate, describe and make checkpoints.

One module per group of commands: ``encode`` (and the output it writes), ``search``,
``index`` (``uform index``, and
``search --index``), ``demo`` (``demo-media``, ``evaluate``), ``checkpoints`` (``new``, ``describe``,
``similarity``, ``export``, ``calibrate``, ``plugins``), ``convert`` (``convert``, ``labels``), ``serve`` (the HTTP server,
whose code is the ``uform.serve`` package); ``inputs`` gathers and encodes
what ``encode`` and ``search`` read; ``saved`` the files ``encode`` writes; ``common`` holds
progress bars, model loading and how names are printed. Every command's model defaults to the
one shipped with uform. docs/cli.md documents each.

The command modules are imported inside :func:`main`, so that a Ctrl-C while they load is
answered as one at any other time (the ``uform`` script's entry, the top-level module
``uform_command``, covers the loading of ``uform`` itself the same way).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def parser() -> argparse.ArgumentParser:
    from . import checkpoints, convert, demo, encode, index, search, serve
    from uform import __version__

    p = argparse.ArgumentParser(prog="uform", description="uform: one multimodal encoder checkpoint, every modality, on ONNX Runtime. "
                                "Every command's model defaults to the one shipped with uform; docs/cli.md documents each.")  # fmt: skip
    p.add_argument("--version", action="version", version=f"uform {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    encode.add_parser(sub)
    search.add_parser(sub)
    index.add_parser(sub)
    demo.add_parsers(sub)
    checkpoints.add_parsers(sub)
    convert.add_parsers(sub)
    serve.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; answer its exit status: 0 done, 1 done but some inputs failed (``encode``,
    ``search``), 2 an error (one line, ``uform: error: ...``, on stderr) or a usage error."""
    try:
        try:
            args = parser().parse_args(argv)
        except SystemExit as exc:  # --help, --version, usage errors: argparse printed what it had to
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        return int(args.run(args))
    except KeyboardInterrupt:
        print("uform: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `uform search ... | head`: the reader left; say nothing more
        _silence_stdout()
        return 141
    except Exception as exc:  # noqa: BLE001 - the CLI reports errors as one line
        from uform.core.errors import UformError

        if isinstance(exc, (UformError, OSError, ValueError, TypeError)):
            from .common import printable

            print(f"uform: error: {printable(str(exc))}", file=sys.stderr)
            return 2
        raise


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises no second BrokenPipeError."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file (captured, replaced)
        pass


if __name__ == "__main__":
    sys.exit(main())
