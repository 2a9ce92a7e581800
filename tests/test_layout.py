"""Layout: what one package needs of another has a public name (no ``_private`` imports or
attributes across package boundaries)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
# private modules still imported from outside their package, and why they are not renamed yet
PENDING_MODULES: dict[str, str] = {}
PENDING_ATTRIBUTES: set[str] = set()


def package_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1])


def imported(tree: ast.AST, package: str) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
    return names


def files() -> list[Path]:
    return sorted([*ROOT.glob("uform/**/*.py"), *ROOT.glob("tests/*.py"), *ROOT.glob("benchmarks/*.py")])


def test_private_modules_stay_inside_their_package() -> None:
    offences = []
    for path in files():
        package = package_of(path)
        for name in imported(ast.parse(path.read_text()), package):
            parts = name.split(".")
            private = next((i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")), None)
            if private is None or parts[0] != "uform" or ".".join(parts[: private + 1]) in PENDING_MODULES:
                continue
            owner = ".".join(parts[:private])
            if package != owner and not package.startswith(owner + "."):
                public = ".".join(parts[:private] + [parts[private][1:]])
                offences.append(f"{path.relative_to(ROOT)} imports {name} (use the public {public})")
    assert offences == []


def test_the_arena_is_written_through_its_public_functions() -> None:
    offences = []
    for path in ROOT.glob("uform/**/*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "uform/core/arena.py" or rel in PENDING_ATTRIBUTES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in {"_lease", "_carve", "_busy", "_buffer", "_generation"}:
                offences.append(f"{rel}:{node.lineno} uses .{node.attr}")
    assert offences == []


def test_ray_is_started_with_public_arguments_only() -> None:
    """docs/scale.md told users to give ``ray.init`` a ``_temp_dir`` (tests/test_ray.py and
    benchmarks/ray.py did too): an underscored argument, one of Ray's "hidden / experimental options, unstable".
    No call of ray.init in the code, tests, benchmarks or docs passes an underscored keyword."""
    import re

    call = re.compile(r"ray\.init\(([^()]|\([^()]*\))*\)", re.S)
    pages = sorted(ROOT.glob("docs/**/*.md"))
    found = [
        f"{path.relative_to(ROOT)}: {m.group(0)}"
        for path in [*files(), *pages]
        for m in call.finditer(path.read_text(encoding="utf-8"))
        if re.search(r"[(,]\s*_\w+\s*=", m.group(0))
    ]
    assert found == []
