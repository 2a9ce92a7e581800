"""Why uform does not switch file descriptor 1 around plugin calls (docs/plugins.md, "What a
plugin prints goes to stderr"): what ``dup2(2, 1)`` around each call would do to another
thread's output.

    python benchmarks/stdout_switch.py [--rows 20000] [--switches 200] [--call-ms 0.5]

A child process prints ``--rows`` flushed rows to stdout from its main thread while another
thread makes ``--switches`` switches of descriptor 1 to stderr, each held ``--call-ms`` (a
plugin call's length); this counts the rows that arrived on each. Writes
benchmarks/results/stdout_switch.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from common import save

CHILD = """
import os, sys, threading, time
rows, switches, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000
def plugin_calls():
    for _ in range(switches):
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(2, 1)
        time.sleep(hold)
        os.dup2(saved, 1)
        os.close(saved)
thread = threading.Thread(target=plugin_calls)
thread.start()
for i in range(rows):
    print(f"row {i}", flush=True)
thread.join()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--switches", type=int, default=200)
    parser.add_argument("--call-ms", type=float, default=0.5)
    parser.add_argument("--out", default="stdout_switch")
    args = parser.parse_args()
    done = subprocess.run([sys.executable, "-c", CHILD, str(args.rows), str(args.switches), str(args.call_ms)],
                          capture_output=True, text=True, check=True, timeout=600)  # fmt: skip
    result = {"rows": args.rows, "switches": args.switches, "call_ms": args.call_ms,
              "rows_on_stdout": done.stdout.count("row "), "rows_on_stderr": done.stderr.count("row ")}  # fmt: skip
    print(f"{result['rows_on_stdout']} rows on stdout, {result['rows_on_stderr']} on stderr")
    save(args.out, result)


if __name__ == "__main__":
    main()
