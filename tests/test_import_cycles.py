"""No import cycles: no module of ``uform/``, ``fastermodels/`` or ``benchmarks/`` reaches itself
through the modules it imports.

Every import is read with ``ast`` as the layer test reads it (``test_architecture.imports``): at
module level, inside functions and under ``if TYPE_CHECKING:`` alike, relative ones resolved,
lazy imports by name included. A benchmark imports its neighbours by bare name (its folder is
on ``sys.path``: ``from common import save``), so there a bare name that is a file of
``benchmarks/`` is that file. A cycle is a strongly connected set of two or more modules; the
test names each one with a path round it. A self-check shows a fabricated cycle is caught.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

from test_architecture import PACKAGES, ROOT, imports, module_name

FOLDERS = (*PACKAGES, "benchmarks")

# The cycles known when this test landed, each being removed by its own change (issue 56, item 6:
# the timing helper both share moves to benchmarks/common.py). The test warns that they remain,
# and fails on any other cycle, on one of these growing, and on one of these gone (so that its
# entry leaves with the change that removed it).
KNOWN: set[frozenset[str]] = set()


def sources() -> list[Path]:
    return sorted(
        p
        for folder in FOLDERS
        for p in (ROOT / folder).rglob("*.py")
        if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)  # a benchmark's own venv is not the project
    )


def targets(path: Path, source: str, benchmarks: set[str]) -> set[str]:
    """The modules of this repository that ``source`` (the text of ``path``) imports;
    ``benchmarks`` names the files of benchmarks/ (``{"common", "lowp", ...}``)."""
    module = module_name(path)
    found = set()
    for name, _ in imports(source, module, path.name == "__init__.py"):
        top = name.split(".")[0]
        if module.startswith("benchmarks.") and top in benchmarks:
            name = f"benchmarks.{name}"  # a neighbour imported by its bare name
            if name.split(".")[:2] == module.split(".")[:2]:
                continue  # benchmarks/ray.py's `import ray` is Ray itself (its folder leaves sys.path)
        if name.split(".")[0] in FOLDERS and name != module:
            found.add(name)
    return found


def graph(files: Mapping[Path, str]) -> dict[str, set[str]]:
    """Each module and the modules of the repository it imports (edges to modules with a file only)."""
    benchmarks = {p.stem for p in files if p.parent == ROOT / "benchmarks"}
    edges = {module_name(path): targets(path, source, benchmarks) for path, source in files.items()}
    return {m: {t for t in out if t in edges} for m, out in edges.items()}


def cycles(edges: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """The strongly connected sets of two or more modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.add(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(frozenset(members))
    return found


def round_trip(edges: Mapping[str, Iterable[str]], members: frozenset[str]) -> str:
    """A path from the cycle's first module back to itself, within the cycle (breadth first)."""
    start = min(members)
    paths = {t: [start, t] for t in sorted(edges[start]) if t in members}
    todo = list(paths)
    while start not in paths:
        node = todo.pop(0)
        for t in sorted(edges[node]):
            if t in members and t not in paths:
                paths[t] = [*paths[node], t]
                todo.append(t)
    return " -> ".join(paths[start])


def test_no_module_reaches_itself_through_its_imports() -> None:
    files = {path: path.read_text() for path in sources()}
    assert len(files) > 100
    edges = graph(files)
    assert "benchmarks.common" in edges["benchmarks.lowp"] and "uform.core.executor" in edges["uform.model"]
    found = cycles(edges)
    unknown = [round_trip(edges, c) for c in found if c not in KNOWN]
    assert unknown == [], "import cycles:\n" + "\n".join(unknown)
    gone = [sorted(c) for c in KNOWN if c not in found]
    assert gone == [], f"these known cycles are gone: take them out of KNOWN: {gone}"
    for c in sorted(KNOWN, key=sorted):
        warnings.warn(f"a known import cycle remains (KNOWN in {Path(__file__).name}): {round_trip(edges, c)}", stacklevel=1)


def test_a_fabricated_cycle_is_caught() -> None:
    fabricated = {
        ROOT / "uform" / "core" / "fabricated_a.py": "def f():\n    import uform.core.fabricated_b\n",  # in a function
        ROOT / "uform" / "core" / "fabricated_b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .fabricated_c import x\n",
        ROOT / "uform" / "core" / "fabricated_c.py": "from uform.core.fabricated_a import y\nimport numpy\n",
        ROOT / "benchmarks" / "fabricated_d.py": "from fabricated_e import y\n",
        ROOT / "benchmarks" / "fabricated_e.py": "def g():\n    import fabricated_d\n",
        ROOT / "benchmarks" / "ray.py": "import ray\n",  # Ray, not itself
    }
    edges = graph(fabricated)
    assert edges["uform.core.fabricated_c"] == {"uform.core.fabricated_a"} and edges["benchmarks.ray"] == set()
    found = cycles(edges)
    assert sorted(map(sorted, found)) == [
        ["benchmarks.fabricated_d", "benchmarks.fabricated_e"],
        ["uform.core.fabricated_a", "uform.core.fabricated_b", "uform.core.fabricated_c"],
    ]
    assert round_trip(edges, found[-1]).count(" -> ") >= 2
