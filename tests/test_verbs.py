"""``Model.served``: what a load serves, as docs/api.md states it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import uform
from uform.calibrate import write_temperatures
from uform.cli import main
from uform.core.host import get_host
from uform.model import runtime_of


def test_a_text_checkpoint_serves_text_encode_alone(tiny_model: uform.Model) -> None:
    served = tiny_model.served
    assert isinstance(served, uform.Served)
    assert dict(served.towers) == {"text": "text"}
    assert dict(served.modalities) == {"text": ("text_encode",)}
    assert served.verbs == frozenset({"text_encode"})
    assert served.choice_temperatures == () and tiny_model.describe().choice_temperature_groups == 0


def test_every_tower_its_modality_and_its_verbs(tiny_all: Path) -> None:
    with uform.Model.load_ram(tiny_all) as model:
        served, runtime = model.served, runtime_of(model)
        assert list(served.towers) == list(runtime.towers)  # checkpoint order
        assert served.towers == {name: tower.modality.name for name, tower in runtime.towers.items()}
        host = get_host()
        assert served.modalities == {m: tuple(sorted(host.modalities[m].verbs)) for m in sorted(set(served.towers.values()))}
        assert list(served.modalities) == sorted(served.modalities)
        assert {"text_encode", "image_encode", "video_encode", "audio_encode", "text_choose"} <= served.verbs
        for verb in served.verbs:
            assert callable(getattr(model, verb))
        groups = model.describe().choice_temperature_groups
        assert len(served.choice_temperatures) == groups >= 1
        assert served.choice_temperatures == tuple(runtime.config.choice_temperatures)
        assert model.on(uform.Executor(1)).served == served  # receivers answer the same record
        with pytest.raises(dataclasses.FrozenInstanceError):
            served.towers = {}  # type: ignore[misc]


def test_choice_temperatures_follow_the_checkpoint(tiny_all: Path, tmp_path: Path) -> None:
    out = tmp_path / "calibrated.safetensors"
    write_temperatures(tiny_all, [0.5, 2.0], out)
    with uform.Model.load_ram(out) as model:
        assert model.served.choice_temperatures == (0.5, 2.0)
        assert model.describe().choice_temperature_groups == 2


def test_describe_prints_the_served_modalities(tiny_all: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["describe", "-m", str(tiny_all), "--json", "-q"]) == 0
    info = json.loads(capsys.readouterr().out)
    with uform.Model.load_ram(tiny_all) as model:
        assert info["modalities"] == {name: list(verbs) for name, verbs in model.served.modalities.items()}


def test_the_one_verb_table_is_what_the_built_in_plugins_provide() -> None:
    """``uform.verbs.ENCODE_VERBS`` names each kind of item's verb once for every caller (inputs,
    index, server, Ray, the held-out reading): each verb is one its modality's plugin provides, and
    every encoding verb of a built-in modality is in it, so a new one fails here until added."""
    from uform.verbs import CHOOSE_VERB, DECODED_KINDS, ENCODE_VERBS, ITEM_VERBS

    host = get_host()
    for kind, verb in ENCODE_VERBS.items():
        modality = kind.split("_")[0]
        assert verb in host.modalities[modality].verbs, (kind, verb)
    built_in = {v for m in ("text", "image", "video", "audio") for v in host.modalities[m].verbs}
    assert built_in == set(ENCODE_VERBS.values())
    assert CHOOSE_VERB in host.modalities["choose"].verbs
    assert DECODED_KINDS < set(ENCODE_VERBS) and dict(ITEM_VERBS) == {k: v for k, v in ENCODE_VERBS.items() if k not in DECODED_KINDS}
    assert list(ITEM_VERBS) == ["text", "image", "video", "audio"]
