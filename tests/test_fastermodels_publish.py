"""A save is all or nothing as a reader sees it: ``kill -9`` at each of its steps leaves an
artifact that loads as the previous save or as the new one, whole, never the weights of one with
the config.json of the other (docs/fastermodels.md, "save_pretrained")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("huggingface_hub")

from safetensors.torch import load_file, save_file  # noqa: E402

from fastermodels import ArtifactReadError, FasterModel, state_hash  # noqa: E402
from test_fastermodels_nets import MLP_KWARGS, MLP_SOURCE, pruned_mlp  # noqa: E402

TESTS = str(Path(__file__).parent)
# The child saves the model of seed argv[2] (recipe {'seed': argv[2]}) into argv[1], and kills
# itself at step argv[3]: before the Nth rename (os.replace) of the save, or, past the last, as
# it removes its hidden folder (shutil.rmtree): every point a kill -9 can land between two steps.
KILLED_SAVE = """
import os, shutil, signal, sys
sys.path.insert(0, sys.argv[4])
from fastermodels import FasterModel
from test_fastermodels_nets import MLP_KWARGS, MLP_SOURCE, pruned_mlp
seed, step = int(sys.argv[2]), int(sys.argv[3])
fm = FasterModel.wrap(pruned_mlp(seed), MLP_SOURCE, MLP_KWARGS, recipe={"seed": seed})
renames, replace, rmtree = [0], os.replace, shutil.rmtree
def counted(*args, **kwargs):
    renames[0] += 1
    if renames[0] == step:
        os.kill(os.getpid(), signal.SIGKILL)
    return replace(*args, **kwargs)
def removed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
os.replace = counted
shutil.rmtree = removed if step == 0 else rmtree
fm.save_pretrained(sys.argv[1])
print("saved", renames[0])
"""


def save(folder: Path, seed: int, step: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", KILLED_SAVE, str(folder), str(seed), str(step), TESTS],
                          capture_output=True, text=True, timeout=300)


def loaded(folder: Path) -> tuple[int, str]:
    """The seed the loaded config.json records and the hash of the weights loaded with it."""
    fm = FasterModel.from_pretrained(folder, trust_remote_code=True)
    return fm.recipe["seed"], state_hash(fm)


def as_an_earlier_fastermodels_saved(folder: Path) -> None:
    """The weights rewritten without the digests this version records."""
    weights = folder / "model.safetensors"
    save_file(load_file(weights), weights)


def fm_of(seed: int) -> FasterModel:
    return FasterModel.wrap(pruned_mlp(seed), MLP_SOURCE, MLP_KWARGS, recipe={"seed": seed})


@pytest.mark.parametrize("earlier", [False, True], ids=["this version", "earlier version"])
def test_a_save_killed_at_any_step_loads_whole_as_the_old_or_the_new(tmp_path: Path, earlier: bool,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Old code: a save killed between its renames of model.safetensors and config.json left the
    new weights beside the old config.json, which loaded as one artifact (seed 0's recipe, seed
    1's weights: both nets have the same spec). Steps: 1 and 2, before the first and the second
    rename of a save over an artifact (model.safetensors, config.json; its README.md is kept), 0
    after both, as its hidden folder is removed."""
    digest = {seed: state_hash(fm_of(seed)) for seed in (0, 1, 2, 3)}
    for step in (0, 1, 2):
        folder = tmp_path / f"step{step}"
        fm_of(0).save_pretrained(folder)
        if earlier:
            as_an_earlier_fastermodels_saved(folder)
        killed = save(folder, 1, step)
        assert killed.returncode == -signal.SIGKILL, (step, killed.stdout, killed.stderr)
        seed, weights = loaded(folder)
        assert (seed, weights) in [(0, digest[0]), (1, digest[1])], step  # never one's recipe with the other's weights
        if not earlier:  # a second save killed alike, over what the first left
            assert save(folder, 2, step).returncode == -signal.SIGKILL
            seed, weights = loaded(folder)
            assert (seed, weights) in [(0, digest[0]), (1, digest[1]), (2, digest[2])], step
        renames: list[object] = []
        replace = os.replace
        monkeypatch.setattr(os, "replace", lambda *a: renames.append(a) or replace(*a))
        fm_of(3).save_pretrained(folder)  # a later save sweeps what the killed ones left
        monkeypatch.undo()
        assert len(renames) in (2, 3), renames  # the two steps above, and one to finish a killed save first
        assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]
        assert loaded(folder) == (3, digest[3])


def test_weights_beside_the_config_json_their_save_replaced_are_refused(tmp_path: Path) -> None:
    """When the killed save's hidden folder is gone too, the pair is refused by name, not loaded."""
    old = tmp_path / "old"
    FasterModel.wrap(pruned_mlp(0), MLP_SOURCE, MLP_KWARGS, recipe={"seed": 0}).save_pretrained(old)
    new = tmp_path / "new"
    new.mkdir()
    (new / "config.json").write_bytes((old / "config.json").read_bytes())
    FasterModel.wrap(pruned_mlp(1), MLP_SOURCE, MLP_KWARGS, recipe={"seed": 1}).save_pretrained(new)
    (new / "config.json").write_bytes((old / "config.json").read_bytes())
    with pytest.raises(ArtifactReadError) as info:
        FasterModel.from_pretrained(new, trust_remote_code=True)
    assert str(info.value).startswith(f"{new / 'config.json'}: the config.json of the save before "
                                      f"{new / 'model.safetensors'} (its sha256 is ")
    assert str(info.value).endswith("files of two saves, left by a save that was stopped; nothing was "
                                    "loaded: save the model again (save_pretrained)")


def test_a_config_json_edited_after_the_save_still_loads(tmp_path: Path) -> None:
    FasterModel.wrap(pruned_mlp(0), MLP_SOURCE, MLP_KWARGS, recipe={"seed": 0}).save_pretrained(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(config.read_text().replace('"seed": 0', '"seed": 0, "note": "by hand"'))
    fm = FasterModel.from_pretrained(tmp_path, trust_remote_code=True)
    assert fm.recipe == {"seed": 0, "note": "by hand"}


def test_an_export_records_the_config_json_it_replaces(tmp_path: Path) -> None:
    """export_artifact saves the weights into its hidden folder, renamed out with its other forms:
    they recorded no previous config.json, so after an export stopped between its renames (and its
    folder swept) the old config.json loaded with the new weights, as if edited by hand."""
    from uform.exporters import export_artifact

    fm_of(0).save_pretrained(tmp_path)
    before = (tmp_path / "config.json").read_bytes()
    export_artifact(fm_of(1), tmp_path, ("safetensors",), example_input=torch.randn(2, 16))
    assert loaded(tmp_path) == (1, state_hash(fm_of(1)))
    (tmp_path / "config.json").write_bytes(before)  # what a stopped export leaves, its folder swept
    with pytest.raises(ArtifactReadError, match="files of two saves, left by a save that was stopped"):
        FasterModel.from_pretrained(tmp_path, trust_remote_code=True)


def test_an_export_without_the_weights_does_not_pair_another_config_json_with_them(tmp_path: Path) -> None:
    """An ONNX-only export of seed 1 into seed 0's artifact wrote seed 1's config.json beside seed 0's
    model.safetensors, and from_pretrained loaded them as one model (recipe seed 1, weights seed 0)."""
    from uform.exporters import export_artifact

    fm_of(0).save_pretrained(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ValueError) as info:
        export_artifact(fm_of(1), tmp_path, ("onnx",), example_input=torch.randn(2, 16))
    assert str(info.value) == (
        f"{tmp_path / 'model.safetensors'}: weights this export's config.json (forms ['onnx']) does not describe; "
        "loading would take them for its model's: add 'safetensors' to forms, so that weights and config.json "
        "are of one model, or export into another folder; nothing was written")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    export_artifact(fm_of(0), tmp_path, ("onnx",), example_input=torch.randn(2, 16))  # the same model: its config.json
    assert loaded(tmp_path) == (0, state_hash(fm_of(0)))
    assert (tmp_path / "model.onnx").is_file()
