"""The ``uform`` script's entry point (``[project.scripts]``): ``uform.cli.main`` behind a
guard that imports nothing of uform first, so that a Ctrl-C while uform loads (numpy, ONNX:
most of a second) is answered as one at any other time: ``uform: interrupted`` on stderr and
exit status 130, never a traceback. ``python -m uform_command`` is the same command."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from uform.cli import main as run
    except KeyboardInterrupt:
        print("uform: interrupted", file=sys.stderr)
        return 130
    return run()


if __name__ == "__main__":
    sys.exit(main())
