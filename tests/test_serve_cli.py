"""``uform serve`` as a process: SIGTERM drains (the request in flight is answered, new
connections are refused, exit status 0 within --drain-seconds), UFORM_API_KEY; and
``uform describe`` naming the modalities and verbs a checkpoint serves."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from ckpt import make_checkpoint
from serving import subprocess_server
from uform.cli import main

LONG = [("a long text about circles and squares " * 4)[:120] + str(i) for i in range(1024)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_drains_in_flight_requests_and_exits_0(sig: signal.Signals) -> None:
    """SIGINT (Ctrl-C) as SIGTERM, as docs/serve.md says: it exited 130 after the drain."""
    key = {"authorization": "Bearer from-env"}
    with subprocess_server(["--drain-seconds", "20"], env={"UFORM_API_KEY": "from-env"}) as server:
        assert httpx.post(server.url + "/v1/embeddings", json={"input": "x"}).status_code == 401
        answers: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: answers.append(
            httpx.post(server.url + "/v1/embeddings", json={"input": LONG}, headers=key, timeout=60)))  # fmt: skip
        sender.start()
        deadline = time.monotonic() + 30
        while 'uform_items_total{modality="text"} 1024.0' not in httpx.get(server.url + "/metrics", headers=key).text:
            # the long request is queued or computing before the signal: a SIGTERM before the server
            # took it would close its connection unanswered, a failure of this test, not of the drain
            assert time.monotonic() < deadline, "the server did not take the long request within 30 s"
            time.sleep(0.01)
        server.proc.send_signal(sig)
        began = time.monotonic()
        sender.join(30)
        assert answers and answers[0].status_code == 200 and len(answers[0].json()["data"]) == len(LONG)
        assert server.proc.wait(20) == 0 and time.monotonic() - began < 20
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.url + "/health", timeout=2)
        assert any("Shutting down" in line for line in server.lines)


def _nice(pid: int, tid: int) -> int:
    return int(Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="per-thread nice values are read from Linux's /proc")
@pytest.mark.parametrize("batching", [[], ["--no-batching"]])
def test_the_models_threads_run_at_a_higher_nice_value_than_the_event_loop(batching: list[str]) -> None:
    from uform.serve.run import MODEL_NICE

    with subprocess_server(batching) as server:
        pid = server.proc.pid
        before = {int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()}  # the loop, ONNX Runtime's threads, uvloop's
        assert httpx.post(server.url + "/v1/embeddings", json={"input": ["a red circle", "a blue square"]}).status_code == 200
        lanes = {int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()} - before  # started by the first request
        base = _nice(pid, pid)  # the event loop's thread keeps the nice value the process started with
        assert lanes and all(_nice(pid, tid) == min(19, base + MODEL_NICE) for tid in lanes)
        others = [_nice(pid, tid) for tid in before - {pid}]
        assert min(19, base + MODEL_NICE) in others and set(others) <= {base, min(19, base + MODEL_NICE)}


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="per-thread nice values are read from Linux's /proc")
def test_model_nice_0_leaves_every_threads_priority_and_a_bad_value_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with subprocess_server(["--model-nice", "0"]) as server:
        pid = server.proc.pid
        assert httpx.post(server.url + "/v1/embeddings", json={"input": ["a red circle"]}).status_code == 200
        base = _nice(pid, pid)
        assert {_nice(pid, int(t.name)) for t in Path(f"/proc/{pid}/task").iterdir()} == {base}
    for bad in ("-1", "20"):
        assert main(["serve", "--model-nice", bad]) == 2
        assert f"--model-nice must be 0-19, got {bad}" in capsys.readouterr().err
    for port in ("70000", "-1"):  # 70000 was taken modulo 65536: the server listened on 4464
        assert main(["serve", "--port", port]) == 2
        assert f"--port must be 0-65535 (0 picks a free one), got {port}" in capsys.readouterr().err
    for flag, value in (("--batch-window-ms", "nan"), ("--drain-seconds", "inf"), ("--drain-seconds", "-1")):
        assert main(["serve", flag, value]) == 2  # NaN was taken, inf ended in an OverflowError traceback
        assert f"{flag[2:]} must be a finite number of 0 or more, got {float(value)}" in capsys.readouterr().err
    from uform.serve.run import serve

    with pytest.raises(ValueError, match=r"port must be 0-65535 \(0 picks a free one\), got 65536"):
        serve(None, None, host="127.0.0.1", port=65536)  # type: ignore[arg-type]  # refused before the model or config is read


def test_without_httptools_the_server_refuses_to_start_naming_the_extra(tmp_path: Path) -> None:
    """uvicorn alone would run its h11 protocol, where none of the guard's bounds apply (--max-connections,
    --header-timeout, --send-timeout, the drain's deadline): it served a fourth connection past
    --max-connections 2 and held a silent one past --header-timeout 1. So it refuses to start, before the model loads."""
    import os
    import subprocess
    import sys

    (tmp_path / "httptools").mkdir()
    (tmp_path / "httptools" / "__init__.py").write_text("raise ImportError(\"No module named 'httptools'\")\n")  # as if not installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "uform.cli", "serve", "--port", "0", "-m", str(tmp_path / "none.safetensors")],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr == "uform: error: uform serve needs the serve extra: pip install 'uform[serve]' (No module named 'httptools')\n", done.stderr


def test_a_host_that_does_not_resolve_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from uform.serve import run

    def unknown(*args: object, **kwargs: object) -> None:  # the resolver's answer, without asking a network
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unknown)
    with pytest.raises(OSError, match=r"cannot listen on nosuchhost.invalid:8000: the host does not resolve \(Name or service not known\)"):
        run._listen("nosuchhost.invalid", 8000)


def test_the_drain_deadline_holds_during_a_long_call() -> None:
    with subprocess_server(["--drain-seconds", "1", "--max-items", "8192", "--max-batch-items", "8192", "--max-batch-tokens", "10000000"]) as server:
        def send() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the server drops it when its drain time runs out
                httpx.post(server.url + "/v1/embeddings", json={"input": LONG * 6}, timeout=60)

        sender = threading.Thread(target=send)
        sender.start()
        time.sleep(0.5)
        server.proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        assert server.proc.wait(15) == 0
        assert time.monotonic() - began < 4, "the process outlived --drain-seconds by far"
        sender.join(10)


def test_threads_and_batches_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    """The library's own threading (--threads 0, one batch at a time) serves the same rows; bad
    values are refused before the model loads."""
    with subprocess_server(["--threads", "0", "--batches-at-once", "1"]) as server:
        got = httpx.post(server.url + "/v1/embeddings", json={"input": ["a red circle", "a blue square"]}).json()
        assert [d["index"] for d in got["data"]] == [0, 1] and len(got["data"][0]["embedding"]) == 64
    for bad in ("-1", "1025"):
        assert main(["serve", "--threads", bad]) == 2
        assert f"--threads must be 0-1024 (0: every core), got {bad}" in capsys.readouterr().err
    assert main(["serve", "--batches-at-once", "0"]) == 2
    for bad in ("abc", "0,x", ",,", "", "-1"):  # 'abc' said only "invalid literal for int()", ',,' served from RAM
        assert main(["serve", "--devices", bad]) == 2
        assert f"--devices must be GPU ids of 0 or more separated by commas (0,1), got {bad!r}" in capsys.readouterr().err


def test_describe_lists_modalities_and_verbs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = make_checkpoint(tmp_path / "text-image.safetensors", "tiny", 0, ["text", "image"])
    assert main(["describe", "--model", str(ckpt), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["modalities"] == {"image": ["image_encode", "image_encode_pixels"], "text": ["text_encode"]}
    assert main(["describe", "--model", str(ckpt)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("modalities"))
    assert line.split(None, 1)[1] == "image (image_encode, image_encode_pixels), text (text_encode)"
    assert main(["describe", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["modalities"]) == {"audio", "choose", "image", "text", "video"}
