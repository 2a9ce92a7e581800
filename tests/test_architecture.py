"""The rule of the house, held true: which part of uform may import which.

Every import of every module under ``uform/`` and ``fastermodels/`` is read with ``ast``: at
module level, inside functions and under ``if TYPE_CHECKING:`` alike, relative ones resolved,
and a lazy import by name (a string constant naming a uform module file, or the constant given
to ``importlib.import_module``) counts too. Each module belongs to one layer (``LAYERS``) and
may import its own layer and those ``ALLOWED`` names; docs/architecture.md states the same
table ("Layers"), and a test checks that it does, so neither can change alone. A self-check
shows that a fabricated wrong arrow is caught.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("uform", "fastermodels")

# module (or package prefix) -> layer; the longest match wins
LAYERS: dict[str, str] = {
    "uform.core": "core",
    "uform.plugins": "plugins",
    "uform.exporters": "exporters",
    "uform": "model",  # uform/__init__.py: the public names
    "uform.model": "model",
    "uform.verbs": "model",
    "uform.typed_verbs": "model",
    "uform.lifecycle": "model",
    "uform.calibrate": "calibrate",
    "uform.demo": "demo",
    "uform.ray": "ray",
    "uform.serve": "serve",
    "uform.index": "index",
    "uform.inputs": "inputs",
    "uform.items": "inputs",
    "uform.cli": "cli",
    "uform.convert": "convert",
    "uform.training": "training",
    "fastermodels": "fastermodels",
}

# layer -> the other layers its modules may import
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "plugins": {"core"},
    "exporters": {"core"},
    "model": {"core", "plugins"},
    "calibrate": {"model", "core"},
    "demo": {"model", "calibrate", "plugins", "core"},  # core: uform.core.files, how outputs are written
    "ray": {"model", "core", "index"},
    "serve": {"model"},
    "inputs": {"model", "core"},
    "index": {"model", "core", "inputs"},
    "cli": {"model", "core", "calibrate", "demo", "exporters", "serve", "index", "inputs", "convert"},
    "convert": {"core"},
    "training": {"model", "core", "plugins", "exporters", "calibrate", "demo"},
    "fastermodels": {"exporters", "core"},  # core: uform.core.files, how save_pretrained writes
}

RUN_TIME = {"core", "model", "plugins", "exporters", "calibrate", "demo", "ray", "serve", "inputs", "index", "cli", "convert"}

# third-party module -> the layers that may import it (docs/architecture.md, "Layers")
THIRD_PARTY: dict[str, set[str]] = {
    "torch": {"training", "exporters", "fastermodels", "convert"},
    "onnxruntime": {"plugins", "exporters"},
    "av": {"plugins", "demo"},
    "pluggy": {"core"},
    "ray": {"ray"},
    "uvicorn": {"serve", "cli"},
    "httptools": {"serve"},
    "uvloop": {"serve"},
    "prometheus_client": {"serve"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if n == 1 and parts[0] == "uform" and len(parts) > 1:
            break  # "uform" is the package's __init__ alone, not every module under it
        layer = LAYERS.get(".".join(parts[:n]))
        if layer is not None:
            return layer
    return None


def is_module_file(module: str) -> bool:
    base = ROOT.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def typing_only(tree: ast.AST) -> set[int]:
    """The ids of the import statements under ``if TYPE_CHECKING:``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            found |= {id(n) for stmt in node.body for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return found


def imports(source: str, module: str, is_package: bool, *, typing: bool = True) -> Iterator[tuple[str, int]]:
    """Every module ``source`` imports (``(name, line)``), resolved to absolute names: for
    ``from X import y``, ``X.y`` where that is a module, else ``X``. ``typing=False`` leaves
    out the imports under ``if TYPE_CHECKING:``, which load nothing."""
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    skip = set() if typing else typing_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                yield (f"{base}.{alias.name}" if is_module_file(f"{base}.{alias.name}") else base), node.lineno
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if name in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
                if isinstance(node.args[0].value, str):
                    yield node.args[0].value, node.lineno
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # a lazy import by name: "uform.plugins.image", "uform.exporters.reference.text:TextTower"
            named = node.value.partition(":")[0]
            if re.fullmatch(r"(uform|fastermodels)(\.\w+)+", named) and ROOT.joinpath(*named.split(".")).with_suffix(".py").is_file():
                yield named, node.lineno


def offences(path: Path, source: str) -> list[str]:
    """Each import in ``source`` (the text of the module at ``path``) that breaks the layers."""
    module = module_name(path)
    layer = layer_of(module)
    if layer is None:
        return [f"{path.relative_to(ROOT)} belongs to no layer: add it to LAYERS and to docs/architecture.md's table"]
    found = []
    is_package = path.name == "__init__.py"
    for name, line in sorted(set(imports(source, module, is_package)), key=lambda i: i[1]):
        target = layer_of(name) if name.split(".")[0] in PACKAGES else layer
        if target != layer and target not in ALLOWED[layer]:
            found.append(f"{path.relative_to(ROOT)}:{line}: {layer} imports {name} ({target})")
    for name, line in sorted(set(imports(source, module, is_package, typing=False)), key=lambda i: i[1]):
        top = name.split(".")[0]
        if top in THIRD_PARTY and layer not in THIRD_PARTY[top]:
            found.append(f"{path.relative_to(ROOT)}:{line}: {layer} imports {name}, which only {sorted(THIRD_PARTY[top])} may")
    return found


def sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def closure(layer: str) -> set[str]:
    """Every layer ``layer`` reaches, through any chain of allowed imports."""
    seen, todo = {layer}, [layer]
    while todo:
        for other in ALLOWED[todo.pop()] - seen:
            seen.add(other)
            todo.append(other)
    return seen


def test_every_import_follows_the_layers() -> None:
    assert len(sources()) > 50
    found = [o for path in sources() for o in offences(path, path.read_text())]
    assert found == [], "\n".join(found)


def test_the_layers_keep_the_rules_of_the_house() -> None:
    assert closure("core") == {"core"}  # core imports no plugin, nothing above it
    assert closure("plugins") == {"plugins", "core"}  # never serve, cli, index, training or demo
    assert closure("exporters") == {"exporters", "core"}
    assert closure("serve") <= {"serve", "model", "core", "plugins"}  # the model's public face, and what it stands on
    for layer in RUN_TIME:
        assert "training" not in closure(layer), f"{layer} reaches training"
    assert closure("fastermodels") == {"fastermodels", "exporters", "core"}
    assert set(ALLOWED) == set(LAYERS.values()) and RUN_TIME == set(ALLOWED) - {"training", "fastermodels"}
    assert not THIRD_PARTY["torch"] & (RUN_TIME - {"exporters", "convert"})  # no torch at run time (exporters: an extra; convert: a .bin source)


def doc_table() -> tuple[dict[str, str], dict[str, set[str]], dict[str, set[str]]]:
    """docs/architecture.md's "Layers": its layer table (modules, may import) and its
    third-party table (module, imported by)."""
    text = DOC.read_text()
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    layers: dict[str, str] = {}
    allowed: dict[str, set[str]] = {}
    third: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        names = [re.findall(r"`([^`]+)`", c) for c in cells]
        if names[1] and names[1][0].startswith(("uform", "fastermodels")):  # | `layer` | `paths` | `may import` |
            layer = names[0][0]
            for p in names[1]:
                layers[p.removesuffix("/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")] = layer
            allowed[layer] = set(names[2])
        else:  # | `third-party module`, ... | `layers` | why |
            third |= {name: set(names[1]) for name in names[0]}
    return layers, allowed, third


def test_docs_architecture_states_these_layers() -> None:
    layers, allowed, third = doc_table()
    assert layers == LAYERS
    assert allowed == ALLOWED
    assert third == THIRD_PARTY


def model_private_names() -> set[str]:
    """The private attributes and methods ``Model`` defines (``_runtime``, ``_life``, ...)."""
    tree = ast.parse((ROOT / "uform" / "model.py").read_text())
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    private = {n.name for n in model.body if isinstance(n, ast.FunctionDef)}
    private |= {n.attr for n in ast.walk(model) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"}
    return {name for name in private if name.startswith("_") and not name.startswith("__")}


def private_reads(source: str, names: set[str]) -> list[int]:
    """Lines of ``source`` that read one of ``names`` on anything but ``self``/``cls``, or name it as a string."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in names:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(node.lineno)
        elif isinstance(node, ast.Constant) and node.value in names:
            found.append(node.lineno)
    return found


def test_nothing_outside_model_reads_models_privates() -> None:
    """What a load serves is ``Model.served``; tests and benchmarks that look beneath the API
    take ``uform.model.runtime_of(model)``; nobody else reads ``model._runtime`` and the like,
    uform/core/ included (its receivers are handed the verb lookup, never told its name)."""
    names = model_private_names()
    assert {"_runtime", "_life", "_executor"} <= names
    found = []
    for path in sorted([*ROOT.glob("uform/**/*.py"), *ROOT.glob("tests/*.py"), *ROOT.glob("benchmarks/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("uform/model.py", "tests/test_architecture.py"):
            continue
        found += [f"{rel}:{line}" for line in private_reads(path.read_text(), names)]
    assert found == []
    assert private_reads("n = model._runtime.towers\nm = getattr(model, '_life')\nself._runtime = 1\n", names) == [1, 2]


RENAMES_AND_SYNCS = {"replace", "rename", "renames", "fsync", "fdatasync", "sync_file_range", "link"}  # os's
FILES = "uform/core/files.py"


def renames_and_syncs(source: str) -> list[int]:
    """Lines of ``source`` that rename a file into place or sync one to disk on their own:
    ``os.replace``/``os.rename``/``os.fsync``/``os.fdatasync``/... (also imported by name),
    ``shutil.move``, and ``Path.replace``/``Path.rename`` (a ``.replace`` of one argument:
    ``str.replace`` takes two)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil"):
            if any(a.name in RENAMES_AND_SYNCS | {"move"} for a in node.names):
                found.append(node.lineno)
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner, name = node.func.value, node.func.attr
        module = owner.id if isinstance(owner, ast.Name) else None
        if module == "os" and name in RENAMES_AND_SYNCS or module == "shutil" and name == "move":
            found.append(node.lineno)
        elif module not in ("os", "shutil", "str") and (name == "rename" or name == "replace" and len(node.args) == 1 and not node.keywords):
            found.append(node.lineno)
    return found


def test_only_core_files_renames_or_syncs_files() -> None:
    """Files are written whole or not at all in one place, uform/core/files.py (docs/cli.md,
    "Files uform writes"): no other module renames a file into place or fsyncs one itself; they
    call ``files.Outputs``, ``write_with``, ``move``, ``sync``."""
    found = []
    for path in sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel != FILES:
            found += [f"{rel}:{line}" for line in renames_and_syncs(path.read_text())]
    assert found == [], "rename or sync a file through uform.core.files:\n" + "\n".join(found)
    assert renames_and_syncs((ROOT / FILES).read_text())  # the one room holds them


def test_the_rename_and_sync_check_bites() -> None:
    source = (
        "import os, shutil\nfrom os import replace\nos.replace(a, b)\nos.fsync(f.fileno())\nos.fdatasync(3)\n"
        "shutil.move(a, b)\npath.with_suffix('.tmp').replace(path)\nstaged.rename(raw)\n"
        "name.replace('a', 'b')\ndataclasses.replace(x, a=1)\nreplace(settings, out=1)\nos.path.join(a, b)\n"
    )
    assert renames_and_syncs(source) == [2, 3, 4, 5, 6, 7, 8]


JSONTEXT = "uform/core/jsontext.py"
OWN_JSON = {  # JSON these modules read is not from outside, or is read by another rule
    "uform/serve/requests.py": "orjson first, with its own depth limit; serve imports uform's public names alone",
    "uform/plugins/oplib/epilogues.py": "the graph's own metadata, written by the same load",
    "uform/plugins/oplib/attention.py": "the graph's own metadata, written by the same load",
}


def json_reads(source: str) -> list[int]:
    """Lines of ``source`` that call ``json.loads`` or ``json.load`` (also imported by name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "json" and any(a.name in ("load", "loads") for a in node.names):
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            if node.func.value.id == "json" and node.func.attr in ("load", "loads"):
                found.append(node.lineno)
    return found


def test_outside_json_is_read_in_one_room() -> None:
    """JSON someone else wrote fails three ways (not JSON, not UTF-8, nested past the stack:
    ``RecursionError``, no ``ValueError``); ``uform.core.jsontext.loads`` turns each into one
    error, and every module reads such JSON through it."""
    found = []
    for path in sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel != JSONTEXT and rel not in OWN_JSON:
            found += [f"{rel}:{line}" for line in json_reads(path.read_text())]
    assert found == [], "read outside JSON with uform.core.jsontext.loads:\n" + "\n".join(found)
    assert all(json_reads((ROOT / rel).read_text()) for rel in [JSONTEXT, *OWN_JSON])  # each exception still reads JSON
    assert json_reads("import json\nfrom json import loads\njson.load(f)\njson.loads(t)\njson.dumps(x)\norjson.loads(b)\n") == [2, 3, 4]


# -- the check can fail ------------------------------------------------------------------

WRONG = {
    "uform/core/fabricated.py": "from ..plugins import text\n",  # core imports a plugin
    "uform/plugins/fabricated.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from uform.serve.routes import create_app\n"  # under TYPE_CHECKING
        "def f():\n    from ..training import recipe\n"  # inside a function, relative
        "    import uform.cli\n"
        "    return importlib.import_module('uform.demo.generate')\n"  # by name
    ),
    "uform/serve/fabricated.py": "from ..training import anything\nLAZY = {'x': 'uform.core.host:get_host'}\n",
    "uform/model_extra.py": "import os\n",  # a module in no layer
    "uform/ray.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\ndef f():\n    import torch\n",  # torch at run time
    "fastermodels/fabricated.py": "from uform.model import Model\n",  # fastermodels imports a run-time layer
}


@pytest.mark.parametrize("path", list(WRONG))
def test_a_fabricated_wrong_arrow_is_caught(path: str) -> None:
    found = offences(ROOT / path, WRONG[path])
    expected = {"uform/plugins/fabricated.py": 4, "uform/serve/fabricated.py": 2}.get(path, 1)
    assert len(found) == expected, found


def test_a_fabricated_good_module_passes_and_the_doc_check_bites() -> None:
    assert offences(ROOT / "uform/plugins/fabricated.py", "from ..core.graph import GraphBuilder\nfrom . import text\nimport numpy\n") == []
    layers, allowed, third = doc_table()
    allowed["plugins"].add("serve")
    assert allowed != ALLOWED
