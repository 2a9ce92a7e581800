"""``uform convert``'s sources besides a folder's model.safetensors: pytorch_model.bin (zip and
legacy), an open_clip training checkpoint, sharded safetensors and their index, and a Hub id
read from the local cache offline or with the weights alone cached; each converts to the file
model.safetensors gives."""

from __future__ import annotations

import contextlib
import json
import re
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

import hf_models  # noqa: E402

from uform.cli import main  # noqa: E402
from uform.convert import convert  # noqa: E402
from convert_folders import copy, header, refused, safetensors_file, sharded, snapshot  # noqa: E402


@contextlib.contextmanager
def empty_hub(cache: Path) -> Iterator[tuple[dict[str, str], list[str]]]:
    """A local server standing for the Hub that answers 404 to everything, and the environment
    that points huggingface_hub at it and at the cache ``cache``; yields (env, paths asked)."""
    import http.server
    import threading

    asked: list[str] = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            asked.append(self.path)
            self.send_error(404)

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}", "HF_HUB_DISABLE_TELEMETRY": "1"}
    try:
        yield env, asked
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_a_pytorch_bin_source_converts_to_the_same_file(clip_dir: Path, clip_file: Path, tmp_path: Path, zipped: bool) -> None:
    """``pytorch_model.bin`` (read by torch with weights_only=True) gives the same tensors as
    model.safetensors, in torch's zip format (mapped) and in its legacy format (torch < 1.6,
    or ``_use_new_zipfile_serialization=False``: torch cannot map it, so it is read whole)."""
    import torch

    d = copy(clip_dir, tmp_path)
    with safetensors_file(d / "model.safetensors") as tensors:
        state = {k: torch.from_numpy(v) for k, v in tensors.items()}
        torch.save(state, d / "pytorch_model.bin", _use_new_zipfile_serialization=zipped)
    (d / "model.safetensors").unlink()
    out = tmp_path / "bin.safetensors"
    convert(d, out, dtype="f32", name="tiny-clip")
    assert out.read_bytes() == clip_file.read_bytes()


def test_an_open_clip_training_checkpoint_converts_as_its_weights(tmp_path: Path) -> None:
    """open_clip's training writes ``epoch_N.pt``: the weights under ``state_dict``, named
    ``module.…`` where it ran under DistributedDataParallel, beside the optimizer's state.
    Saved as open_clip_pytorch_model.bin it converts to the bytes its bare weights give."""
    pytest.importorskip("open_clip")
    import torch

    d, model = hf_models.make_open_clip(tmp_path / "oc")
    plain = tmp_path / "plain.safetensors"
    convert(d, plain, dtype="f32", name="oc")
    state = {f"module.{k}": v for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters()).state_dict()
    torch.save({"epoch": 3, "name": "run", "state_dict": state, "optimizer": optimizer}, d / "open_clip_pytorch_model.bin")
    trained = tmp_path / "trained.safetensors"
    convert(d, trained, dtype="f32", name="oc")
    assert trained.read_bytes() == plain.read_bytes()


def test_a_hub_id_is_read_from_the_local_cache_offline(clip_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``uform convert owner/name OUT`` with HF_HUB_OFFLINE=1 reads the Hugging Face cache
    (laid out as huggingface_hub keeps it: refs/main naming a snapshot) and records the Hub id."""
    pytest.importorskip("huggingface_hub")
    cache = tmp_path / "hub"
    repo = cache / "models--openai--clip-vit-base-patch32"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(clip_dir, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    out = tmp_path / "clip-b32.safetensors"
    assert main(["convert", "openai/clip-vit-base-patch32", str(out)]) == 0
    assert "from openai/clip-vit-base-patch32" in capsys.readouterr().out
    assert header(out)[0]["source"]["name"] == "openai/clip-vit-base-patch32"


def test_sharded_safetensors_convert_to_the_same_file(clip_dir: Path, clip_file: Path, tmp_path: Path) -> None:
    """Weights in shards named by model.safetensors.index.json (as large models are published)."""
    d = copy(clip_dir, tmp_path)
    shards = sharded(d)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: s for s, part in shards.items() for n in part}}))
    out = tmp_path / "sharded.safetensors"
    convert(d, out, dtype="f32", name="tiny-clip")
    assert out.read_bytes() == clip_file.read_bytes()
    (d / "model-00002-of-00002.safetensors").unlink()
    refused(d, tmp_path, "model-00002-of-00002.safetensors: missing")
    # a shard outside the directory (another model's file, the user's own) is never read
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes((d / "model-00001-of-00002.safetensors").read_bytes())
    for shard in ("../elsewhere.safetensors", str(outside), "..", 7):
        table = {n: shard if s.startswith("model-00002") else s for s, part in shards.items() for n in part}
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": table}))
        refused(d, tmp_path, rf"model.safetensors.index.json: weight_map gives '.*' the shard {re.escape(repr(shard))}, not a file name in")


def test_a_cache_with_the_weights_alone_asks_the_hub_for_the_rest(clip_dir: Path, tmp_path: Path) -> None:
    """``CLIPModel.from_pretrained`` caches config.json and the weights only: where a download
    is allowed, ``uform convert`` asks the Hub for the tokenizer and preprocessing the snapshot
    lacks (a local server stands for the Hub here and answers 404, so the conversion then names
    the missing tokenizer); a snapshot holding them is read without asking."""
    pytest.importorskip("huggingface_hub")
    repo = tmp_path / "hub" / "models--openai--clip-vit-base-patch32"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(clip_dir / name, snapshot / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    run = [sys.executable, "-c", "import sys; from uform.cli import main; sys.exit(main(sys.argv[1:]))", "convert", "openai/clip-vit-base-patch32"]
    with empty_hub(tmp_path / "hub") as (env, asked):
        partial = subprocess.run(run + [str(tmp_path / "a.safetensors")], env=env, capture_output=True, text=True, timeout=300)
        assert partial.returncode != 0 and "no tokenizer" in partial.stderr, partial.stderr
        assert any("openai/clip-vit-base-patch32" in path for path in asked), asked
        asked.clear()
        for f in clip_dir.iterdir():
            if f.is_file() and not (snapshot / f.name).exists():
                shutil.copy(f, snapshot / f.name)
        whole = subprocess.run(run + [str(tmp_path / "b.safetensors")], env=env, capture_output=True, text=True, timeout=300)
        assert whole.returncode == 0, whole.stderr
        assert asked == []


def test_a_tensor_the_index_leaves_out_names_the_index(clip_dir: Path, tmp_path: Path) -> None:
    """A weight_map that leaves out a tensor its shard holds (or gives a tensor to a shard without
    it) was "SHARD1, SHARD2: tensor 'logit_scale' is missing (...)": the shards are whole, the
    index is at fault, and the error now names it."""
    d = copy(clip_dir, tmp_path)
    shards = sharded(d)
    table = {n: s for s, part in shards.items() for n in part}
    index = d / "model.safetensors.index.json"
    left, holder = "logit_scale", table["logit_scale"]
    index.write_text(json.dumps({"weight_map": {n: s for n, s in table.items() if n != left}}))
    refused(d, tmp_path, rf"^{re.escape(str(index))}: weight_map leaves out tensor '{left}', which {re.escape(holder)} holds \(the model's logit scale\)$")
    other = next(s for s in shards if s != holder)
    index.write_text(json.dumps({"weight_map": {**table, left: other}}))
    refused(d, tmp_path, rf"^{re.escape(str(index))}: weight_map gives tensor '{left}' the shard {re.escape(other)}, which does not hold it; {re.escape(holder)} does \(the model's logit scale\)$")


def test_a_cached_chinese_clip_with_its_vocab_txt_is_read_without_asking_the_hub(tmp_path: Path) -> None:
    """A whole cached Chinese-CLIP snapshot (OFA-Sys's repositories hold a WordPiece ``vocab.txt``,
    no tokenizer.json) was taken for one with the weights alone: ``uform convert`` asked the Hub
    for the rest again on every conversion (``/api/models/...``, here a local server standing for
    the Hub), where docs/models.md says a cached snapshot that holds its files is read without
    asking. Now ``vocab.txt`` counts as a tokenizer: the snapshot converts, nothing asked."""
    pytest.importorskip("huggingface_hub")
    from chinese_clip_models import SMALL, make_chinese_clip

    repo = tmp_path / "hub" / "models--OFA-Sys--chinese-clip-vit-base-patch16"
    make_chinese_clip(repo / "snapshots" / ("0" * 40), SMALL)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    out = tmp_path / "cclip.safetensors"
    run = [sys.executable, "-c", "import sys; from uform.cli import main; sys.exit(main(sys.argv[1:]))", "convert", "OFA-Sys/chinese-clip-vit-base-patch16", str(out)]
    with empty_hub(tmp_path / "hub") as (env, asked):
        done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert asked == []
    assert header(out)[0]["source"] == {"architecture": "ChineseCLIPModel", "converter": header(out)[0]["source"]["converter"], "family": "chinese_clip", "name": "OFA-Sys/chinese-clip-vit-base-patch16"}


def test_preprocessing_saved_by_a_transformers_5_processor_converts_alike(tmp_path: Path) -> None:
    """transformers 5's ``ClapProcessor.save_pretrained`` / ``ChineseCLIPProcessor.save_pretrained``
    write no preprocessor_config.json: the feature extractor's or image processor's settings go
    under ``feature_extractor`` / ``image_processor`` in ``processor_config.json``. A fine-tune
    saved so was refused for CLAP ('no preprocessor_config.json; ... copy the file from the model's
    repository') and, worse, converted for Chinese-CLIP with CLIP's defaults (a shorter-side resize
    and crop where the processor resizes the picture whole to a square): other embeddings, said
    only in a note. Now that section is read: the file is the one preprocessor_config.json gives,
    and a Hub snapshot holding it counts as whole."""
    import transformers

    from chinese_clip_models import SMALL, make_chinese_clip
    from clap_text_models import make_clap
    from uform.convert import hub

    clap = make_clap(tmp_path / "clap")
    cclip = make_chinese_clip(tmp_path / "cclip", SMALL)
    processors = {
        clap: transformers.ClapProcessor(feature_extractor=transformers.ClapFeatureExtractor.from_pretrained(clap), tokenizer=transformers.AutoTokenizer.from_pretrained(clap)),
        cclip: transformers.ChineseCLIPProcessor(image_processor=transformers.ChineseCLIPImageProcessor.from_pretrained(cclip), tokenizer=transformers.BertTokenizer.from_pretrained(cclip)),
    }
    for source, processor in processors.items():
        saved = tmp_path / f"{source.name}-t5"
        saved.mkdir()
        for name in ("config.json", "model.safetensors"):
            shutil.copy(source / name, saved / name)
        processor.save_pretrained(saved)
        assert not (saved / "preprocessor_config.json").exists() and (saved / "processor_config.json").is_file()
        before, after = tmp_path / f"{source.name}.safetensors", tmp_path / f"{source.name}-t5.safetensors"
        convert(source, before, dtype="f32", name="m")
        done = convert(saved, after, dtype="f32", name="m")
        assert header(after)[:2] == header(before)[:2] and not any("preprocessor" in note for note in done.notes), done.notes
        assert hub._complete(saved)
