"""Builds the op library (native/uform_ops) as part of the package; see docs/op-library.md.

Everything else about the package is in pyproject.toml. The library is a plain shared object
loaded by ONNX Runtime and ctypes, not a Python module. When it cannot be built (no C++
compiler, no ONNX Runtime headers), the package still installs: the reason is written beside
where the library would be, `uform plugins` shows it, and loads use the cpu backend.

Beside it, on Linux x86-64, the CPUID view (native/cpuid_view): a plain shared object the
benchmarks load to measure as on a lower CPU class (benchmarks/cpu_view.py); nothing at run
time uses it, and the package installs without it likewise.
"""

from __future__ import annotations

import platform
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent
NATIVE = ROOT / "native" / "uform_ops"
sys.path.insert(0, str(ROOT / "native"))

from ops_build import cache_key, compile_parallel, compiler_identity, lookup, store  # noqa: E402
from ort_headers import HeadersUnavailable, find  # noqa: E402

ERROR_SUFFIX = ".build-error.txt"


class BuildOps(build_ext):
    """Builds each library, or records why not and goes on; an editable install (``pip install
    -e .``, which builds in a temporary folder and copies into the source tree) copies what was
    built and, for what was not, the reason, removing a library left there by an earlier build."""

    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name))
        failure = target.parent / (ext.name.rpartition(".")[2] + ERROR_SUFFIX)
        try:
            if ext.name == ops.name:
                self.build_ops(ext, target)
            else:
                super().build_extension(ext)
        except (HeadersUnavailable, OSError, Exception) as exc:  # noqa: BLE001 - the package installs without it
            failure.parent.mkdir(parents=True, exist_ok=True)
            failure.write_text(f"{type(exc).__name__}: {exc}\n")
            print(f"uform: {ext.name} was not built ({exc}); {CONSEQUENCE[ext.name]}", file=sys.stderr)
            return
        failure.unlink(missing_ok=True)

    def build_ops(self, ext: Extension, target: Path) -> None:
        """The op library from the build cache when the same sources, headers, arguments and
        compiler built it before (native/ops_build.py), else compiled on every CPU and cached."""
        include = find()
        ext.include_dirs.append(str(include))
        argv = getattr(self.compiler, "compiler_so", None) or [self.compiler.compiler_type]
        compiler = compiler_identity([*argv, *(getattr(self.compiler, "linker_so", None) or [])])  # LDFLAGS are in the key too
        key = cache_key([*ext.sources, *ext.depends], include, ext.extra_compile_args, compiler)
        cached = lookup(key)
        if cached is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cached, target)
            print(f"uform: {ext.name} taken from the build cache ({cached.parent}), built from the same sources", file=sys.stderr)
            return
        ext.extra_objects = [*ext.extra_objects, *compile_parallel(self, ext)]
        ext.sources = []  # compiled above; setuptools links the objects
        super().build_extension(ext)
        try:
            store(key, target)
        except OSError as exc:  # a cache that cannot be written costs the next install a build, nothing else
            print(f"uform: {ext.name} not kept in the build cache ({exc})", file=sys.stderr)

    def copy_extensions_to_source(self) -> None:
        # an optional extension's missing library is not copied (setuptools), so the rest installs
        super().copy_extensions_to_source()
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            package, _, name = self.get_ext_fullname(ext.name).rpartition(".")
            source = Path(build_py.get_package_dir(package))
            built = Path(self.build_lib) / self.get_ext_filename(self.get_ext_fullname(ext.name))
            reason = built.parent / (name + ERROR_SUFFIX)
            if built.is_file():
                (source / (name + ERROR_SUFFIX)).unlink(missing_ok=True)
                continue
            (source / Path(built).name).unlink(missing_ok=True)  # an earlier build's library: not this install's
            if reason.is_file():
                (source / reason.name).write_text(reason.read_text())


ops = Extension(
    "uform._ops",
    sources=[str(p.relative_to(ROOT)) for p in sorted(NATIVE.glob("*.cpp"))],
    depends=[str(p.relative_to(ROOT)) for p in sorted(NATIVE.glob("*.[hi]*"))],
    include_dirs=[str(NATIVE.relative_to(ROOT))],
    extra_compile_args=["-O3", "-std=c++17", "-fvisibility=hidden", "-fno-math-errno", "-ffp-contract=off", "-Wno-psabi"],  # fp-contract: a fused multiply-add only where the source writes one (a variant and its scalar model compute the same bits); psabi: the amx model passes 64-byte vectors on a baseline build
    language="c++",
    optional=True,  # BuildOps records why it was not built; the package installs without it
)

cpuid_view = Extension(
    "uform._cpuid_view",
    sources=["native/cpuid_view/cpuid_view.c"],
    extra_compile_args=["-O2", "-fvisibility=default"],
    language="c",
    optional=True,
)
CONSEQUENCE = {ops.name: "loads will use the cpu backend", cpuid_view.name: "benchmarks/cpu_view.py will not run"}
linux_x86 = sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")

setup(ext_modules=[ops, cpuid_view] if linux_x86 else [ops], cmdclass={"build_ext": BuildOps})
