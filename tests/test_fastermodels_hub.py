"""load and from_pretrained against a Hub repo id, served by a local stand-in for the Hub's HTTP API.

huggingface_hub reads HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE when it is imported, so the
Hub side runs in a child interpreter started with those set; the stand-in listens on
127.0.0.1 in a thread of this process. Nothing here reaches the real network.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytest.importorskip("huggingface_hub")
pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402

from fastermodels import FasterModel, export_artifact, state_hash  # noqa: E402
from test_fastermodels_nets import RESNET_KWARGS, RESNET_SOURCE, pruned_resnet18  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REPO, INT8_REPO, EMPTY_REPO = "local-org/pruned-resnet18", "local-org/pruned-resnet18-int8", "local-org/empty"
DEEP_REPO = "local-org/deep-config"  # a config.json nested past Python's stack
# config.json files the mixin's json.load would raise bare errors on: an integer past Python's
# 4,300-digit limit (ValueError), bytes that are not UTF-8 (UnicodeDecodeError), a JSON list
# (AttributeError: no .items())
BAD_CONFIGS = {"local-org/long-int": '{"source": "torchvision.models.resnet18", "x": 1' + "0" * 5000 + "}",
               "local-org/latin-1": b'{"source": "torchvision.models.resnet18", "x": "\xe9"}',
               "local-org/list": "[1, 2]"}
TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)/?$")
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<name>.+)$")


class StandInHub(ThreadingHTTPServer):
    """Serves directories as Hub model repos: the tree listing, and HEAD/GET of resolve URLs."""

    def __init__(self, repos: dict[str, Path]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.repos, self.seen, self.lock = repos, [], threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: StandInHub

    def log_message(self, *args: object) -> None:  # keep pytest output clean
        pass

    def _reply(self, status: int, body: bytes, headers: dict[str, str], head: bool) -> None:
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _serve(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        with self.server.lock:
            self.server.seen.append(f"{self.command} {path}")
        match = TREE.match(path) or RESOLVE.match(path)
        directory = self.server.repos.get(match["repo"]) if match else None
        if match is None or directory is None:
            return self._reply(404, b"{}", {"X-Error-Code": "RepoNotFound"}, head)
        commit = hashlib.sha1(match["repo"].encode()).hexdigest()
        files = {p.name: p for p in directory.iterdir() if p.is_file()}
        if match.re is TREE:
            listing = [{"type": "file", "path": name, "size": p.stat().st_size,
                        "oid": hashlib.sha1(p.read_bytes()).hexdigest()} for name, p in files.items()]
            return self._reply(200, json.dumps(listing).encode(),
                               {"Content-Type": "application/json"}, head)
        if match["name"] not in files:
            return self._reply(404, b"{}", {"X-Error-Code": "EntryNotFound",
                                            "X-Repo-Commit": commit}, head)
        body = files[match["name"]].read_bytes()
        self._reply(200, body, {"X-Repo-Commit": commit, "Content-Type": "application/octet-stream",
                                "ETag": f'"{hashlib.sha256(body).hexdigest()}"'}, head)

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(head=False)


CHILD = """
import json, sys
import numpy as np, onnxruntime as ort, torch
from fastermodels import ArtifactNotFoundError, ArtifactReadError, FasterModel, load, state_hash

x, expected = torch.from_numpy(np.load(sys.argv[1])), np.load(sys.argv[2])
out = {}
def diff(y):
    return float(np.abs(np.asarray(y) - expected).max())
with torch.no_grad():
    model = load(sys.argv[3])
    out["auto"] = [type(model).__name__, model.training, state_hash(model), diff(model(x))]
    fm = FasterModel.from_pretrained(sys.argv[3])
    out["from_pretrained"] = [fm.training, state_hash(fm), fm.recipe]
    ts = load(sys.argv[3], form="torchscript", trust_remote_code=True)
    out["torchscript"] = [ts.training, diff(ts(x))]
for key, repo, form in (("onnx", sys.argv[3], "onnx"), ("int8", sys.argv[4], "auto")):
    path = load(repo, form=form)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    out[key] = [str(path), diff(session.run(None, {"input": x.numpy()})[0])]
try:
    load(sys.argv[5])
except ArtifactNotFoundError as e:
    out["empty"] = str(e)
try:
    load(sys.argv[6])
except ArtifactReadError as e:
    out["deep"] = str(e)
for repo in sys.argv[7:]:
    try:
        load(repo)
    except Exception as e:
        out[repo] = f"{type(e).__name__}: {e}"

import socket  # offline: from the cache alone, with every connection refused
def refuse(*args, **kwargs):
    raise OSError("network refused in the offline phase")
socket.socket.connect = refuse
with torch.no_grad():
    model = load(sys.argv[3], local_files_only=True)
    out["offline_auto"] = [type(model).__name__, state_hash(model), diff(model(x))]
out["offline_int8"] = str(load(sys.argv[4], local_files_only=True))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StandInHub, Path, str]]:
    tmp = tmp_path_factory.mktemp("hub")
    pruned = pruned_resnet18()
    fm = FasterModel.wrap(pruned, RESNET_SOURCE, RESNET_KWARGS, recipe={"prune": "odd widths"})
    example = torch.randn(1, 3, 64, 64)
    export_artifact(fm, tmp / "full", example_input=example)
    export_artifact(fm, tmp / "int8", example_input=example, int8=True)
    (tmp / "empty").mkdir()
    (tmp / "empty" / "README.md").write_text("no artifact")
    (tmp / "deep").mkdir()
    (tmp / "deep" / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp / "deep" / "model.safetensors").write_bytes((tmp / "full" / "model.safetensors").read_bytes())
    bad_repos = {}
    for repo, text in BAD_CONFIGS.items():
        folder = tmp / repo.split("/")[1]
        folder.mkdir()
        (folder / "config.json").write_bytes(text if isinstance(text, bytes) else text.encode())
        (folder / "model.safetensors").write_bytes((tmp / "full" / "model.safetensors").read_bytes())
        bad_repos[repo] = folder
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        np.save(tmp / "x.npy", x.numpy())
        np.save(tmp / "expected.npy", pruned(x).numpy())
    server = StandInHub({REPO: tmp / "full", INT8_REPO: tmp / "int8", EMPTY_REPO: tmp / "empty", DEEP_REPO: tmp / "deep",
                         **bad_repos})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, tmp, state_hash(fm)
    finally:
        server.shutdown()
        server.server_close()


def _child(server: StandInHub, tmp: Path) -> dict[str, list[object] | str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGINGFACE_")) and k not in ("HTTP_PROXY", "HTTPS_PROXY")}
    env.update(HF_ENDPOINT=server.endpoint, HF_HOME=str(tmp / "hf_home"), HF_HUB_OFFLINE="0",
               HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1", NO_PROXY="127.0.0.1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(Path(__file__).parent), *filter(None, [os.environ.get("PYTHONPATH")])]))
    argv = [str(tmp / "x.npy"), str(tmp / "expected.npy"), REPO, INT8_REPO, EMPTY_REPO, DEEP_REPO, *BAD_CONFIGS]
    result = subprocess.run([sys.executable, "-c", CHILD, *argv], env=env, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def child(hub: tuple[StandInHub, Path, str]) -> dict[str, list[object] | str]:
    """One child interpreter: torch and torchvision take seconds to import."""
    return _child(hub[0], hub[1])


def test_load_from_a_hub_repo_id(hub: tuple[StandInHub, Path, str],
                                 child: dict[str, list[object] | str]) -> None:
    server, tmp, digest = hub
    out = child
    assert out["auto"][:3] == ["FasterModel", False, digest] and out["auto"][3] == 0.0
    assert out["from_pretrained"] == [False, digest, {"prune": "odd widths"}]
    assert out["torchscript"][0] is False and out["torchscript"][1] <= 1e-5
    scale = float(np.abs(np.load(tmp / "expected.npy")).max())
    assert out["onnx"][1] <= 1e-4 and out["int8"][1] <= 0.1 * scale  # INT8: within 10 % of range
    cache = str(tmp / "hf_home")
    assert out["onnx"][0].startswith(cache) and out["onnx"][0].endswith("model.onnx")
    assert out["int8"][0].startswith(cache)
    for name in ("model.safetensors", "model.torchscript.pt", "model.onnx"):
        assert name in out["empty"]
    assert out["deep"] == f"{DEEP_REPO}/config.json: not JSON (nested too deeply), so not a config.json"  # was a RecursionError
    for repo, reason in (("local-org/long-int", "an integer of more than 4300 digits"),
                         ("local-org/latin-1", "not UTF-8: byte 0xe9 at offset 48")):
        assert out[repo] == f"ArtifactReadError: {repo}/config.json: not JSON ({reason}), so not a config.json"
    assert out["local-org/list"] == ("ArtifactReadError: local-org/list/config.json: holds a JSON list, not the "
                                     "object of source, source_kwargs, modules, recipe and provenance")
    assert f"GET /api/models/{REPO}/tree/main" in server.seen
    assert f"GET /{REPO}/resolve/main/model.safetensors" in server.seen
    assert f"GET /{INT8_REPO}/resolve/main/model.onnx" in server.seen
    assert not any(INT8_REPO in s and "model.safetensors" in s for s in server.seen)


def test_offline_load_reads_the_cache_only(hub: tuple[StandInHub, Path, str],
                                           child: dict[str, list[object] | str]) -> None:
    digest = hub[2]
    assert child["offline_auto"] == ["FasterModel", digest, 0.0]
    assert child["offline_int8"] == child["int8"][0]
