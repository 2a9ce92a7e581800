"""Where the build finds ONNX Runtime's C API headers (a build dependency, never committed).

ONNX Runtime's pip wheels ship no headers. In order:

1. ``UFORM_ORT_INCLUDE``: a folder holding ``onnxruntime_c_api.h``;
2. a cache from an earlier build (``$XDG_CACHE_HOME/uform-build/onnxruntime-<version>``);
3. Debian's ``libonnxruntime-dev`` from the distribution after the machine's own (fetched
   with apt-get into private lists and caches, the system's apt configuration untouched),
   unpacked into that cache.

The op library is built against this C API version and loads in any ONNX Runtime at least
as new: the C API is versioned and append-only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

VERSION = "1.21"  # the C API the library is written against (ORT_API_VERSION 21)
HEADER = "onnxruntime_c_api.h"
SUITE = "trixie"  # the Debian release carrying libonnxruntime-dev 1.21
PACKAGE = "libonnxruntime-dev"


class HeadersUnavailable(RuntimeError):
    """No headers could be found or fetched; the message says why and what to set."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "uform-build" / f"onnxruntime-{VERSION}"


def find() -> Path:
    """The folder holding ``onnxruntime_c_api.h``, fetching it when needed."""
    given = os.environ.get("UFORM_ORT_INCLUDE")
    if given:
        if not (Path(given) / HEADER).is_file():
            raise HeadersUnavailable(f"UFORM_ORT_INCLUDE={given} holds no {HEADER}")
        return Path(given)
    cached = cache_dir() / "include"
    if (cached / HEADER).is_file():
        return cached
    return fetch_debian(cached)


def debian_mirror() -> str:
    """The Debian mirror the machine's own apt sources name."""
    texts = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            texts.append(path.read_text())
        except OSError:
            continue
    for text in texts:
        for match in re.finditer(r"(?:^URIs:\s*|^deb\s+(?:\[[^\]]*\]\s+)?)(\S+/debian)/?\s", text, re.M):
            return match.group(1)
    raise HeadersUnavailable("no Debian mirror in /etc/apt sources; set UFORM_ORT_INCLUDE to ONNX Runtime's include folder")


def fetch_debian(target: Path) -> Path:
    """Download ``libonnxruntime-dev`` from Debian and unpack its headers into ``target``."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise HeadersUnavailable("apt-get and dpkg-deb are not here; set UFORM_ORT_INCLUDE to ONNX Runtime's include folder")
    mirror = debian_mirror()
    with tempfile.TemporaryDirectory(prefix="uform-ort-") as tmp:
        work = Path(tmp)
        for sub in ("lists/partial", "cache/archives/partial"):
            (work / sub).mkdir(parents=True)
        (work / "sources.list").write_text(f"deb {mirror} {SUITE} main\n")
        options = [
            f"-oDir::Etc::sourcelist={work / 'sources.list'}", "-oDir::Etc::sourceparts=-",
            f"-oDir::State::Lists={work / 'lists'}", f"-oDir::Cache={work / 'cache'}", "-oAPT::Sandbox::User=root",
            "-oDebug::NoLocking=1", "-qq",
        ]  # fmt: skip
        for args in (["update"], ["download", PACKAGE]):
            done = subprocess.run(["apt-get", *options, *args], cwd=work, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise HeadersUnavailable(f"apt-get {' '.join(args)} failed: {done.stderr.strip()[-400:]}")
        debs = sorted(work.glob(f"{PACKAGE}_*.deb"))
        if not debs:
            raise HeadersUnavailable(f"apt-get download left no {PACKAGE} package")
        subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(work / "root")], check=True, timeout=120)
        include = work / "root" / "usr" / "include" / "onnxruntime"
        if not (include / HEADER).is_file():
            raise HeadersUnavailable(f"{debs[-1].name} holds no {HEADER}")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="include-", dir=target.parent))
        shutil.copytree(include, staging, dirs_exist_ok=True)
        try:
            staging.rename(target)
        except OSError:  # another build got there first
            shutil.rmtree(staging, ignore_errors=True)
    return target


if __name__ == "__main__":
    print(find())
