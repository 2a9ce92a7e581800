"""The README's first command without a compiler: ``pip install -e .`` installs, and ``uform
plugins`` names the float32 fallback with the reason the op library was not built.

A copy of the package's tracked sources goes into a virtual environment that sees this one's
packages (``--system-site-packages``, ``--no-build-isolation --no-deps``: no network), built
with ``CC=CXX=/bin/false``, the compiler that always fails (and a stand-in for ONNX Runtime's
headers, so nothing is fetched). About ten seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def tracked(*paths: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", *paths], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def sources_copy(source: Path) -> Path:
    """The package's tracked sources copied into ``source``, as a fresh clone holds them."""
    for name in tracked("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "uform_command.py", "native", "uform"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    return source


@pytest.mark.skipif(not (ROOT / ".git").exists() or shutil.which("git") is None, reason="needs the git checkout's sources")
@pytest.mark.skipif(sys.platform != "linux", reason="the failing compiler is /bin/false")
def test_editable_install_without_a_compiler_falls_back(tmp_path: Path) -> None:
    source = sources_copy(tmp_path / "src")
    # a library an earlier build left in the tree is not this install's: it must go
    stale = source / "uform" / ("_ops" + str(sysconfig.get_config_var("EXT_SUFFIX")))
    stale.write_bytes(b"not a library")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    headers = tmp_path / "include"  # never fetched: the compiler fails before reading them
    headers.mkdir()
    (headers / "onnxruntime_c_api.h").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "UFORM_OPS_LIBRARY")}
    env |= {"CC": "/bin/false", "CXX": "/bin/false", "UFORM_ORT_INCLUDE": str(headers)}
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-e", ".", "--no-build-isolation", "--no-deps", "--no-index", "-q"],
        cwd=source, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    assert not stale.exists()
    reason = (source / "uform" / "_ops.build-error.txt").read_text()
    assert "/bin/false" in reason
    where = subprocess.run([str(python), "-c", "import uform; print(uform.__file__)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert Path(where.stdout.strip()) == source / "uform" / "__init__.py"
    plugins = subprocess.run([str(venv / "bin" / "uform"), "plugins"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert plugins.returncode == 0, plugins.stderr
    lines = {line.strip().partition(":")[0]: line for line in plugins.stdout.splitlines() if line.startswith("  ")}
    assert "unavailable: the op library was not built with this install of uform" in lines["e4m3 (ram)"]
    assert "/bin/false" in lines["e4m3 (ram)"]
    assert lines["cpu (ram)"].strip() == "cpu (ram): available"


FAKE_COMPILER = """#!/bin/sh
# a compiler that compiles nothing: it logs each call and writes what -o names
echo "$@" >> "$UFORM_TEST_COMPILER_LOG"
[ "$1" = "--version" ] && { echo "fake-c++ 1.0"; exit 0; }
while [ $# -gt 0 ]; do [ "$1" = "-o" ] && { echo "built by the fake compiler" > "$2"; }; shift; done
"""


@pytest.mark.skipif(not (ROOT / ".git").exists() or shutil.which("git") is None, reason="needs the git checkout's sources")
@pytest.mark.skipif(sys.platform != "linux", reason="the fake compiler is a shell script")
def test_a_second_install_of_the_same_sources_takes_the_library_from_the_build_cache(tmp_path: Path) -> None:
    source = sources_copy(tmp_path / "src")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    compiler = tmp_path / "fake-c++"
    compiler.write_text(FAKE_COMPILER)
    compiler.chmod(0o755)
    headers = tmp_path / "include"
    headers.mkdir()
    (headers / "onnxruntime_c_api.h").write_text("/* the C API */\n")
    log = tmp_path / "calls.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "UFORM_OPS_LIBRARY")}
    env |= {"CC": str(compiler), "CXX": str(compiler), "LDSHARED": f"{compiler} -shared", "LDCXXSHARED": f"{compiler} -shared",
            "UFORM_ORT_INCLUDE": str(headers), "XDG_CACHE_HOME": str(tmp_path / "cache"), "UFORM_TEST_COMPILER_LOG": str(log)}  # fmt: skip
    library = source / "uform" / ("_ops" + str(sysconfig.get_config_var("EXT_SUFFIX")))
    sources = sorted(p.name for p in (source / "native" / "uform_ops").glob("*.cpp"))

    def install() -> list[str]:
        log.write_text("")
        library.unlink(missing_ok=True)
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-e", ".", "--no-build-isolation", "--no-deps", "--no-index", "-q"],
            cwd=source, env=env, capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return [line for line in log.read_text().splitlines() if " -c " in f" {line} " and "uform_ops" in line]

    compiled = install()
    assert sorted(Path(next(a for a in line.split() if a.endswith(".cpp"))).name for line in compiled) == sources
    assert library.read_text() == "built by the fake compiler\n"
    assert install() == []  # the same sources: nothing compiled, the library copied
    assert library.read_text() == "built by the fake compiler\n"
    (source / "native" / "uform_ops" / "ops.cpp").write_text((source / "native" / "uform_ops" / "ops.cpp").read_text() + "\n// changed\n")
    assert len(install()) == len(sources)  # one byte of one source changed: all compiled again
    env["LDFLAGS"] = "-Wl,--as-needed"
    assert len(install()) == len(sources)  # another linker command line: a library of other bytes, built again
