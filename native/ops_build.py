"""How setup.py compiles the op library: its sources in parallel, one compiler a CPU, and the
library kept in a cache keyed by everything its bytes come from.

A second ``pip install -e '.[extra]'`` of the same checkout (the README's way of adding an
extra) builds the package again from nothing; with the cache it copies the library instead of
compiling it again. The key is a hash of every source and header of the library (the
``depends`` of the extension), ONNX Runtime's C API header, the compile arguments, the
compiler's and linker's command lines (CFLAGS, LDFLAGS) and ``--version``, and the Python extension suffix: a change to any of them is
a miss, never a stale library. The cache lives beside the headers' cache
(``$XDG_CACHE_HOME/uform-build/``, see ort_headers.py) and keeps the newest few builds.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ort_headers import HEADER, cache_dir

KEEP = 4  # builds kept in the cache, newest first by use


def cache_root() -> Path:
    return cache_dir().parent / "ops"


def compiler_identity(argv: Sequence[str]) -> str:
    """The compiler's command line and what ``--version`` says of it ("" when it cannot say)."""
    try:
        done = subprocess.run([argv[0], "--version"], capture_output=True, text=True, timeout=60)
        version = done.stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    return "\0".join([*argv, version])


def cache_key(files: Sequence[str], include: Path, args: Sequence[str], compiler: str) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + Path(name).read_bytes() + b"\0")
    digest.update((include / HEADER).read_bytes())
    digest.update("\0".join([*args, compiler, str(sysconfig.get_config_var("EXT_SUFFIX"))]).encode())
    return digest.hexdigest()[:32]


def lookup(key: str) -> Path | None:
    """The cached library of ``key``, marked as just used, or None."""
    for found in (cache_root() / key).glob("*"):
        os.utime(found.parent)
        return found
    return None


def store(key: str, library: Path) -> None:
    """Keep ``library`` under ``key`` (written whole, then renamed), dropping the oldest builds."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="building-", dir=root))
    shutil.copy2(library, staging / library.name)
    try:
        staging.rename(root / key)
    except OSError:  # another build stored the same key first
        shutil.rmtree(staging, ignore_errors=True)
    builds = sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith("building-")), key=lambda p: p.stat().st_mtime)
    for old in builds[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)


def compile_parallel(command: Any, ext: Any) -> list[str]:
    """Compile ``ext``'s sources as setuptools' build_ext would, one source a task on as many
    threads as this process may use CPUs; returns the objects, in the sources' order."""
    macros = [*ext.define_macros, *((name,) for name in ext.undef_macros)]
    Path(command.build_temp).mkdir(parents=True, exist_ok=True)

    def one(source: str) -> list[str]:
        return command.compiler.compile(
            [source], output_dir=command.build_temp, macros=macros, include_dirs=ext.include_dirs,
            debug=command.debug, extra_postargs=ext.extra_compile_args, depends=ext.depends,
        )  # fmt: skip

    jobs = min(len(ext.sources), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return [obj for objects in pool.map(one, sorted(ext.sources)) for obj in objects]
