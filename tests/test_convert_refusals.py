"""``uform convert``'s refusals, each a clear error naming the item and the reason, nothing
written: names, missing sources and files, architectures, configs, shapes, weights,
tokenizers, preprocessing uform lacks, open_clip variants, outs that cannot be written (an
earlier out kept as it was)."""

from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

import hf_models  # noqa: E402

from uform.cli import main  # noqa: E402
from uform.convert import ConvertError, convert  # noqa: E402
from convert_folders import copy, edit_config, header, refused, safetensors_file, snapshot  # noqa: E402


@pytest.mark.parametrize("name", ["", "  ", "a\nb", "evil\x1b[31m", 7])
def test_a_name_that_is_empty_or_not_printable_is_refused(clip_dir: Path, tmp_path: Path, name: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """--name '' was taken as no name (the directory's recorded), a control character recorded and
    printed as it is (an escape sequence reached the terminal of whoever ran uform describe)."""
    out = tmp_path / "c.safetensors"
    with pytest.raises(ValueError, match="name must be some printable text .*, got " + re.escape(repr(name))):
        convert(clip_dir, out, name=name)
    if isinstance(name, str):
        assert main(["convert", str(clip_dir), str(out), "--name", name]) == 2
        assert "name must be some printable text" in capsys.readouterr().err
    assert not out.exists()


def test_missing_source_and_missing_files(clip_dir: Path, tmp_path: Path) -> None:
    refused(tmp_path / "nowhere", tmp_path, "no such directory, and not a Hugging Face Hub id")
    d = copy(clip_dir, tmp_path)
    (d / "model.safetensors").rename(d / "elsewhere.bin")
    refused(d, tmp_path, "no weights: expected model.safetensors")
    (d / "elsewhere.bin").rename(d / "model.safetensors")
    (d / "tokenizer.json").unlink()
    refused(d, tmp_path, "no tokenizer")
    (d / "config.json").unlink()
    refused(d, tmp_path, "no config.json")


def test_hub_id_offline_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    refused("nobody-here/no-such-model", tmp_path, "not in the local Hugging Face cache, and HF_HUB_OFFLINE forbids a download")


def test_a_hub_id_without_a_network_says_what_to_do_on_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Without a network, ``uform convert openai/clip-vit-base-patch32 clip.safetensors`` (the
    README's command) said only the Hub's 'Please check your internet connection', over two lines
    (printed with a literal \\n), and nothing of what to do where there is no network."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub.errors import LocalEntryNotFoundError

    def no_network(repo: str, *, local_files_only: bool = False, **kwargs: Any) -> str:
        raise LocalEntryNotFoundError("Got: ConnectError: [Errno -2] Name or service not known\nAn error happened while trying "
                                      "to locate the files on the Hub. Please check your internet connection and try again.")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    what_to_do = re.escape("; without a network, convert a model directory instead (the files save_pretrained writes")
    refused("openai/clip-vit-base-patch32", tmp_path, r"^openai/clip-vit-base-patch32: cannot download it from the Hugging Face Hub "
            r"\(LocalEntryNotFoundError: Got: ConnectError: \[Errno -2\] Name or service not known An error happened .*\)" + what_to_do)
    assert main(["convert", "openai/clip-vit-base-patch32", str(tmp_path / "clip.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\\n" not in err and "HF_HOME" in err, err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    refused("openai/clip-vit-base-patch32", tmp_path, "HF_HUB_OFFLINE forbids a download" + what_to_do)
    assert not (tmp_path / "clip.safetensors").exists()


def test_a_config_nested_past_the_stack_is_refused_by_name(clip_dir: Path, tmp_path: Path) -> None:
    d = copy(clip_dir, tmp_path)
    (d / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    refused(d, tmp_path, r"config.json: cannot be read as JSON \(nested too deeply\)")


def test_unsupported_architectures_are_named(clip_dir: Path, tmp_path: Path) -> None:
    d = copy(clip_dir, tmp_path)
    edit_config(d, lambda c: c.update(model_type="blip", architectures=["BlipModel"]))
    refused(d, tmp_path, r"architecture BlipModel \(model_type 'blip'\) is not supported; supported: CLIPModel .*SiglipModel .*Siglip2Model")


def test_shapes_that_disagree_with_the_config(clip_dir: Path, tmp_path: Path) -> None:
    d = copy(clip_dir, tmp_path)
    edit_config(d, lambda c: c["vision_config"].update(intermediate_size=96))
    refused(d, tmp_path, r"tensor 'vision_model.encoder.layers.0.mlp.fc1.weight' has shape \[128, 64\], but the config says \[96, 64\]")
    edit_config(d, lambda c: c["vision_config"].update(intermediate_size=128, hidden_act="relu"))
    refused(d, tmp_path, "hidden_act 'relu' is not supported")


@pytest.mark.parametrize(
    ("section", "key", "value", "match"),
    [
        ("vision_config", "patch_size", 0, r"config.json vision_config: field 'patch_size' is 0, not a positive integer"),
        ("vision_config", "num_attention_heads", 0, r"vision_config: field 'num_attention_heads' is 0, not a positive integer"),
        ("text_config", "hidden_size", 64.5, r"text_config: field 'hidden_size' is 64.5, not a positive integer"),
        ("text_config", "num_hidden_layers", -1, r"text_config: field 'num_hidden_layers' is -1, not a positive integer"),
        ("text_config", "layer_norm_eps", "abc", r"text_config: field 'layer_norm_eps' is 'abc', not a positive number"),
        ("text_config", "hidden_act", ["gelu"], r"text_config: hidden_act \['gelu'\] is not supported"),
        ("vision_config", "image_size", 4, r"vision_config.image_size 4 is smaller than one patch \(patch_size 8\)"),
        ("", "text_config", [64], r"config.json: field 'text_config' is \[64\], not an object"),
    ],
)
def test_config_fields_of_the_wrong_kind_are_refused_by_name(clip_dir: Path, tmp_path: Path, section: str, key: str, value: Any, match: str) -> None:
    d = copy(clip_dir, tmp_path)
    edit_config(d, lambda c: (c[section] if section else c).update({key: value}))
    refused(d, tmp_path, match)


def test_what_a_load_would_refuse_is_refused_before_writing(clip_dir: Path, tmp_path: Path) -> None:
    """Fields inside the source's own bounds but outside a uform file's: the converted config
    and tensors pass the load's own checks before a byte is written."""
    from uform.core import safetensors

    d = copy(clip_dir, tmp_path)
    path = d / "preprocessor_config.json"
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps(cfg | {"image_std": [0, 0.2, 0.2]}))
    refused(d, tmp_path, r"image_std \[0, 0.2, 0.2\] is not a list of 3 finite numbers above 0")
    path.write_text(json.dumps(cfg | {"image_std": [1e-7, 0.2, 0.2]}))
    refused(d, tmp_path, r"the converted file would not load \(config field towers.image.std: 1e-07 is not a number in \[1e-06, 1000.0\]\); nothing was written")
    path.write_text(json.dumps(cfg))
    edit_config(d, lambda c: c["text_config"].update(layer_norm_eps=0.5))
    refused(d, tmp_path, r"would not load \(config field towers.text.layer_norm_eps: expected a number in \[1e-12, 0.01\], got 0.5\)")
    edit_config(d, lambda c: c["text_config"].update(layer_norm_eps=1e-5))
    with safetensors_file(d / "model.safetensors") as tensors:
        tensors["logit_scale"] = np.full_like(tensors["logit_scale"], 800.0)
        safetensors.write(d / "model.safetensors", tensors, {"format": "pt"})
    refused(d, tmp_path, r"tensor 'logit_scale' holds 800, whose exp \(the labels' scale\) is past 1e\+06")


def test_nan_weights_are_refused(clip_dir: Path, tmp_path: Path) -> None:
    from uform.core import safetensors

    d = copy(clip_dir, tmp_path)
    with safetensors_file(d / "model.safetensors") as tensors:
        tensors["vision_model.post_layernorm.bias"][3] = np.nan
        safetensors.write(d / "model.safetensors", tensors, {"format": "pt"})
    refused(d, tmp_path, r"vision_model.post_layernorm.bias.*NaN")


def test_unknown_tensors_are_refused(clip_dir: Path, tmp_path: Path) -> None:
    from uform.core import safetensors

    d = copy(clip_dir, tmp_path)
    with safetensors_file(d / "model.safetensors") as tensors:
        tensors["vision_model.extra.layer_scale"] = np.ones(64, np.float32)
        safetensors.write(d / "model.safetensors", tensors, {"format": "pt"})
    refused(d, tmp_path, "tensors this conversion does not know: vision_model.extra.layer_scale")


def test_a_tokenizer_that_does_not_parse(clip_dir: Path, tmp_path: Path) -> None:
    d = copy(clip_dir, tmp_path)
    (d / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')
    refused(d, tmp_path, "tokenizer.json: the tokenizer does not parse")


def test_a_tokenizer_with_ids_past_the_embedding_is_refused(clip_dir: Path, tmp_path: Path) -> None:
    """A tokenizer.json of 49,408 tokens whose 'dog</w>' is numbered 60000 converted (its count
    fits the 49,408 rows), and text_encode(['a dog']) then failed in ONNX Runtime ('indices
    element out of data bounds, idx=60000'); one token more than the rows is refused too."""
    d = copy(clip_dir, tmp_path)
    tok = json.loads((d / "tokenizer.json").read_text())
    tok["model"]["vocab"]["dog</w>"] = 60000
    (d / "tokenizer.json").write_text(json.dumps(tok))
    refused(d, tmp_path, r"tokenizer.json: the tokenizer's token 'dog</w>' has id 60000, past the 49408 rows of the text embedding \(config.json text_config.vocab_size\)$")
    tok["model"]["vocab"]["dog</w>"] = 1929
    tok["added_tokens"].append({"id": 49408, "content": "<extra>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    (d / "tokenizer.json").write_text(json.dumps(tok))
    refused(d, tmp_path, r"tokenizer.json: the tokenizer has 49409 tokens, more than the 49408 rows of the text embedding \(config.json text_config.vocab_size\)$")


def test_an_out_that_cannot_be_written(clip_dir: Path, clip_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The one writer of outputs (uform.core.files): a missing folder, a read-only file and a link
    to /dev/full are refused naming OUT, before any work; the old file stays, nothing is left."""
    from uform.core.files import OutputError

    old = tmp_path / "old.safetensors"
    shutil.copy(clip_file, old)
    old.chmod(0o444)
    (tmp_path / "full.safetensors").symlink_to("/dev/full")
    before = snapshot(tmp_path)
    for out, why in (("no-such-dir/x.safetensors", f"no such folder {tmp_path}/no-such-dir"),
                     ("old.safetensors", "read-only; left as it was"),
                     ("full.safetensors", "not a regular file \\(/dev/full\\); not replaced")):  # fmt: skip
        with pytest.raises(OutputError, match=f"^{tmp_path}/{out}: {why}"):
            convert(clip_dir, tmp_path / out, force=True)
        assert main(["convert", str(clip_dir), str(tmp_path / out), "--force"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"uform: error: {tmp_path}/{out}: ") and "Traceback" not in err, err
    with pytest.raises(ConvertError, match="is a directory"):
        convert(clip_dir, tmp_path)
    assert snapshot(tmp_path) == before


def test_an_out_in_a_read_only_folder(clip_dir: Path, tmp_path: Path) -> None:
    """Root runs the command without the capability that overrides permission bits (``setpriv``,
    as tests/test_index_cli.py does), so the refusal is the one a user gets."""
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permission bits cannot be made to bind")
    (tmp_path / "ro").mkdir(mode=0o555)
    try:
        run = subprocess.run([*(drop if os.geteuid() == 0 else []), sys.executable, "-m", "uform.cli", "convert", str(clip_dir), "ro/x.safetensors"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        (tmp_path / "ro").chmod(0o755)
    assert (run.returncode, run.stdout) == (2, "") and run.stderr == "uform: error: ro/x.safetensors: cannot be written (Permission denied)\n"
    assert list((tmp_path / "ro").iterdir()) == []


LIMITED = """
import resource, sys
from uform.cli import main
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.exit(main(sys.argv[2:]))
"""


def test_a_conversion_under_a_file_size_limit_keeps_the_old_out(clip_dir: Path, clip_file: Path, tmp_path: Path) -> None:
    """``ulimit -f 64; uform convert SRC OUT`` (OUT an earlier conversion): one line naming OUT,
    status 2, the old file byte for byte, no temporary file left."""
    out = tmp_path / "x.safetensors"
    shutil.copy(clip_file, out)
    before = snapshot(tmp_path)
    assert out.stat().st_size > 64 * 1024
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = subprocess.run([sys.executable, "-c", LIMITED, str(64 * 1024), "convert", str(clip_dir), str(out), "--dtype", "f32"],
                         env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 2 and run.stdout == "", (run.stdout, run.stderr)
    assert run.stderr == f"uform: error: {out}: not written (File too large); the old file is as it was\n"
    assert snapshot(tmp_path) == before


def test_a_refused_conversion_keeps_the_old_out(clip_dir: Path, clip_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "kept.safetensors"
    shutil.copy(clip_file, out)
    before = out.read_bytes()
    d = copy(clip_dir, tmp_path)
    edit_config(d, lambda c: c["text_config"].update(hidden_size=32))
    with pytest.raises(ConvertError):
        convert(d, out)
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["kept.safetensors", d.name]


def test_open_clip_variants_are_refused_by_field(tmp_path: Path) -> None:
    pytest.importorskip("open_clip")
    d, _ = hf_models.make_open_clip(tmp_path / "oc")
    path = d / "open_clip_config.json"
    cfg = json.loads(path.read_text())
    cfg["model_cfg"]["text_cfg"]["no_causal_mask"] = True
    path.write_text(json.dumps(cfg))
    refused(d, tmp_path, r"model_cfg.text_cfg.no_causal_mask = True is not supported")
    cfg["model_cfg"]["text_cfg"].pop("no_causal_mask")
    cfg["model_cfg"]["vision_cfg"]["layers"] = [3, 4, 6, 3]
    path.write_text(json.dumps(cfg))
    refused(d, tmp_path, r"a ResNet tower is not supported")
    for edit, match in [
        (lambda m: m["vision_cfg"].update(layers=2, patch_size=0), r"patch_size 0, width 64, head_width 16 are not supported"),
        (lambda m: m["text_cfg"].update(mlp_ratio="4"), r"text_cfg: field 'mlp_ratio' is '4', not a positive number"),
        (lambda m: m.update(text_cfg="wide"), r"model_cfg: field 'text_cfg' is 'wide', not an object"),
    ]:
        changed = json.loads(json.dumps(cfg))
        changed["model_cfg"]["vision_cfg"]["layers"] = 2
        edit(changed["model_cfg"])
        path.write_text(json.dumps(changed))
        refused(d, tmp_path, match)
    path.write_text(json.dumps(cfg | {"model_cfg": {**cfg["model_cfg"], "vision_cfg": {**cfg["model_cfg"]["vision_cfg"], "layers": 2}}, "preprocess_cfg": {"mean": ["a", 1, 2]}}))
    refused(d, tmp_path, r"preprocess_cfg: mean \['a', 1, 2\] is not a list of 3 finite numbers")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clean": "canonicalize"}, r"tokenizer_kwargs.clean = 'canonicalize' is not supported \(uform converts open_clip's default SimpleTokenizer: clean = 'lower', reduction_mask = ''\)$"),
        ({"clean": "whitespace"}, r"tokenizer_kwargs.clean = 'whitespace' is not supported"),
        ({"reduction_mask": "simple"}, r"tokenizer_kwargs.reduction_mask = 'simple' is not supported"),
        ({"context_length": 32}, r"tokenizer_kwargs.context_length = 32 is not supported"),
        ({"additional_special_tokens": ["<x>"]}, r"tokenizer_kwargs.additional_special_tokens = \['<x>'\] is not supported"),
        ("lower", r"model_cfg.text_cfg.tokenizer_kwargs = 'lower' is not an object$"),
    ],
)
def test_open_clip_tokenizer_kwargs_other_than_the_default_are_refused(tmp_path: Path, kwargs: Any, match: str) -> None:
    """open_clip's tokenizer cleans the text as ``text_cfg.tokenizer_kwargs`` says (``clean``
    'canonicalize' removes punctuation, 'whitespace' keeps the case): the file's tokenizer.json
    does what the default ('lower') does, so another value was converted into other ids than
    open_clip's; each is refused by name, the default converts."""
    pytest.importorskip("open_clip")
    d, _ = hf_models.make_open_clip(tmp_path / "oc")
    path = d / "open_clip_config.json"
    cfg = json.loads(path.read_text())
    cfg["model_cfg"]["text_cfg"]["tokenizer_kwargs"] = kwargs
    path.write_text(json.dumps(cfg))
    refused(d, tmp_path, match)
    cfg["model_cfg"]["text_cfg"]["tokenizer_kwargs"] = {"clean": "lower", "reduction_mask": ""}
    path.write_text(json.dumps(cfg))
    assert convert(d, tmp_path / "default.safetensors", name="oc").family == "open_clip"


def test_preprocessing_uform_lacks_is_refused(clip_dir: Path, tmp_path: Path) -> None:
    d = copy(clip_dir, tmp_path)
    path = d / "preprocessor_config.json"
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps(cfg | {"crop_size": {"height": 28, "width": 28}}))
    refused(d, tmp_path, r"crop_size \{'height': 28, 'width': 28\} are not supported: uform resizes the shorter side to the tower's image_size 32")
    path.write_text(json.dumps(cfg | {"resample": 0}))
    refused(d, tmp_path, r"resample 0 is not supported; supported: 2 \(bilinear\), 3 \(bicubic\)")
    for rescale in (False, None, "no"):  # do_rescale false converted: transformers fed levels 0-255 to the mean and std, uform 0-1
        path.write_text(json.dumps(cfg | {"do_rescale": rescale}))
        refused(d, tmp_path, rf"preprocessor_config.json: do_rescale {rescale!r} is not supported; supported: true \(levels scaled by 1/255 before the mean and std\)$")
    path.unlink()  # no preprocessor_config.json: the family's defaults, said in a note
    done = convert(d, tmp_path / "defaults.safetensors")
    assert any("no preprocessor_config.json" in note for note in done.notes)
    assert header(tmp_path / "defaults.safetensors")[0]["towers"]["image"]["mean"] == pytest.approx(hf_models.CLIP_MEAN)
