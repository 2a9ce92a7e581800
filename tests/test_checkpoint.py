"""Checkpoints: deterministic creation, and every malformed file refused with a clear error."""

from __future__ import annotations

import json
import re
import mmap
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import uform
from uform.core import checkpoint, safetensors
from uform.core.host import get_host

from ckpt import make_checkpoint


def test_new_is_deterministic(tmp_path: Path) -> None:
    a = make_checkpoint(tmp_path / "a.safetensors", seed=7, modalities=["text"])
    b = make_checkpoint(tmp_path / "b.safetensors", seed=7, modalities=["text"])
    c = make_checkpoint(tmp_path / "c.safetensors", seed=8, modalities=["text"])
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_written_file_reads_with_the_safetensors_library(tiny_text: Path) -> None:
    from safetensors.numpy import load_file

    ours = safetensors.parse(memoryview(tiny_text.read_bytes()))
    theirs = load_file(str(tiny_text))
    assert set(theirs) == set(ours.entries)
    name = "text.embed.weight"
    assert np.array_equal(theirs[name].view(np.uint16), ours.array(name).view(np.uint16))


def test_config_round_trips_and_tensors_are_bf16(tiny_text: Path) -> None:
    c = safetensors.parse(memoryview(tiny_text.read_bytes()))
    config = json.loads(c.metadata["uform"])
    assert config["format"] == "uform" and config["format_version"] == 1
    assert config["dimensions"] == 32 and config["context"] == 32
    assert config["towers"]["text"] == {"width": 64, "depth": 2, "heads": 2, "mlp_width": 128, "token_width": 16}
    assert {e.dtype for e in c.entries.values()} == {"BF16"}
    assert c.entries["text.pos.weight"].shape == (33, 64)


def test_unknown_preset_and_modality() -> None:
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        checkpoint.new(get_host(), "huge", 0, ["text"])
    with pytest.raises(uform.UnsupportedError, match="no installed plugin provides the modalities \\['smell'\\]"):
        checkpoint.new(get_host(), "tiny", 0, ["smell"])


# -- malformed files ----------------------------------------------------------------------


def _raw(path: Path) -> tuple[dict, bytes]:
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def _pack(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _with_config(path: Path, edit) -> bytes:  # type: ignore[no-untyped-def]
    header, data = _raw(path)
    config = json.loads(header["__metadata__"]["uform"])
    edit(config)
    header["__metadata__"]["uform"] = json.dumps(config)
    return _pack(header, data)


def _deep_header() -> bytes:
    text = b'{"a":' + b"[" * 10**5 + b"]" * 10**5 + b"}"
    return struct.pack("<Q", len(text)) + text


def _with_config_text(path: Path, text: str) -> bytes:
    header, data = _raw(path)
    header["__metadata__"]["uform"] = text
    return _pack(header, data)


def _with_entry(path: Path, name: str, **changes: object) -> bytes:
    header, data = _raw(path)
    header[name].update(changes)
    return _pack(header, data)


def _without(path: Path, name: str) -> bytes:
    """The checkpoint without tensor ``name``: its entry and its bytes (the tensors after it moved up)."""
    header, data = _raw(path)
    begin, end = header.pop(name)["data_offsets"]
    for entry in (e for k, e in header.items() if k != "__metadata__" and e["data_offsets"][0] >= end):
        entry["data_offsets"] = [o - (end - begin) for o in entry["data_offsets"]]
    return _pack(header, data[:begin] + data[end:])


def _with_extra(path: Path) -> bytes:
    header, data = _raw(path)
    extra = np.zeros(4, ml_dtypes.bfloat16).tobytes()
    header["text.stray"] = {"dtype": "BF16", "shape": [4], "data_offsets": [len(data), len(data) + 8]}
    return _pack(header, data + extra)


def _overlap(path: Path) -> bytes:
    header, data = _raw(path)
    first = header["text.cls"]["data_offsets"]
    header["text.ln_final.bias"]["data_offsets"] = first  # same shape [64], same span
    return _pack(header, data)


def _twice(path: Path, key: str) -> bytes:
    """The header with ``key``'s entry written a second time, last (Python's json keeps the last)."""
    header, data = _raw(path)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) + len(key) + 6 + len(json.dumps(header[key]))) + text[:-1] + f', "{key}": {json.dumps(header[key])}}}'.encode() + data


def _with_gap(path: Path) -> bytes:
    """64 bytes no tensor covers between the first tensor and the second."""
    header, data = _raw(path)
    spans = sorted((e["data_offsets"], k) for k, e in header.items() if k != "__metadata__")
    end = spans[0][0][1]
    for (begin, stop), name in spans[1:]:
        header[name]["data_offsets"] = [begin + 64, stop + 64]
    return _pack(header, data[:end] + bytes(64) + data[end:])


CASES = {
    "empty": (lambda p: b"", "too short"),
    "truncated": (lambda p: p.read_bytes()[:1000], "runs past the end|outside the"),
    "header beyond file": (lambda p: struct.pack("<Q", 1 << 20) + b"{}", "runs past the end"),
    "huge header length": (lambda p: struct.pack("<Q", 1 << 62) + b"{}", "exceeds the"),
    "header not json": (lambda p: struct.pack("<Q", 5) + b"{oops", "header is not JSON"),
    "header not object": (lambda p: struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    "header nested too deeply": (lambda p: _deep_header(), r"header is not JSON \(nested too deeply\)"),
    "config nested too deeply": (lambda p: _with_config_text(p, "[" * 10**5 + "]" * 10**5), r"config in __metadata__\[\"uform\"\] is not JSON \(nested too deeply\)"),
    "header integer too long": (lambda p: struct.pack("<Q", 5006) + b'{"a":' + b"9" * 5000 + b"}", r"header is not JSON \(an integer of more than 4300 digits\)"),
    "config integer too long": (lambda p: _with_config_text(p, '{"dim": ' + "9" * 5000 + "}"), r"config in __metadata__\[\"uform\"\] is not JSON \(an integer of more than 4300 digits\)"),
    "offsets outside": (lambda p: _with_entry(p, "text.cls", data_offsets=[0, 1 << 40]), "'text.cls'.*outside"),
    "offsets vs shape": (lambda p: _with_entry(p, "text.cls", shape=[65]), "'text.cls'.*needs"),
    "negative shape": (lambda p: _with_entry(p, "text.cls", shape=[-64]), "'text.cls'.*shape"),
    "unknown dtype": (lambda p: _with_entry(p, "text.cls", dtype="Q7"), "'text.cls'.*unknown dtype"),
    "dtype not a string": (lambda p: _with_entry(p, "text.cls", dtype=["BF16"]), r"'text.cls': unknown dtype \['BF16'\]"),
    "overlap": (_overlap, "overlap"),
    "metadata zero": (lambda p: _pack({**_raw(p)[0], "__metadata__": 0}, _raw(p)[1]), "__metadata__ must map strings to strings"),
    "metadata a list": (lambda p: _pack({**_raw(p)[0], "__metadata__": []}, _raw(p)[1]), "__metadata__ must map strings to strings"),
    "tensor named twice": (lambda p: _twice(p, "text.cls"), r"header is not JSON \(the key 'text.cls' appears twice in one object\)"),
    "metadata twice": (lambda p: _twice(p, "__metadata__"), r"header is not JSON \(the key '__metadata__' appears twice in one object\)"),
    "config key twice": (lambda p: _with_config_text(p, json.dumps(json.loads(_raw(p)[0]["__metadata__"]["uform"]))[:-1] + ', "dimensions": 64}'), r"config in __metadata__\[\"uform\"\] is not JSON \(the key 'dimensions' appears twice in one object\)"),
    "gap between tensors": (_with_gap, "bytes 128 to 192 of the data section, before tensor 'text.blocks.0.attn.out.weight', belong to no tensor"),
    "bytes after the tensors": (lambda p: _pack(*_raw(p)) + bytes(8), r"the last 8 bytes of the 177416-byte data section belong to no tensor"),
    "wrong dtype": (lambda p: _with_entry(p, "text.cls", dtype="F16"), "'text.cls': dtype F16"),
    "wrong shape": (lambda p: _with_entry(p, "text.cls", shape=[32, 2]), "'text.cls': shape \\[32, 2\\]"),
    "missing tensor": (lambda p: _without(p, "text.blocks.1.mlp.fc2.bias"), "'text.blocks.1.mlp.fc2.bias' is missing"),
    "extra tensor": (_with_extra, "'text.stray' belongs to no tower"),
    "no config": (lambda p: _pack({k: v for k, v in _raw(p)[0].items() if k != "__metadata__"}, _raw(p)[1]), r"has no config: __metadata__\[\"uform\"\] is missing; a safetensors file of another library \(a Hugging Face model's, or one shard of it\) is not a uform checkpoint: `uform convert` makes a checkpoint of a model's directory \(docs/models.md\)$"),
    "a sharded model's index": (lambda p: b'{\n  "metadata": {"total_size": 8}, "weight_map": {}}\n', r"header length \d+ exceeds the 104857600-byte limit; the file is JSON text \(a sharded model's model.safetensors.index.json\?\), not safetensors: `uform convert` makes"),
    "a length that starts like JSON": (lambda p: struct.pack("<Q", 0x207B) + b"{}", r"header length 8315 runs past the end of the 10-byte file$"),
    "a zip archive": (lambda p: b"PK\x03\x04" + bytes(100), r"header length \d+ runs past the end of the 104-byte file; the file is a zip archive \(PyTorch's pytorch_model.bin\?\), not safetensors"),
    "config missing field": (lambda p: _with_config(p, lambda c: c.pop("dimensions")), "config field dimensions is missing"),
    "tower missing field": (lambda p: _with_config(p, lambda c: c["towers"]["text"].pop("heads")), "towers.text.heads is missing"),
    "absurd width": (lambda p: _with_config(p, lambda c: c["towers"]["text"].update(width=10**9)), "towers.text.width.*1000000000"),
    "heads not dividing": (lambda p: _with_config(p, lambda c: c["towers"]["text"].update(heads=3)), "does not divide width"),
    "unknown config field": (lambda p: _with_config(p, lambda c: c.update(dimension=64)), r"config field dimension: not a field of the format \(version 1: choice_temperatures, context, dimensions, format, format_version, towers\)$"),
    "unknown tower field": (lambda p: _with_config(p, lambda c: c["towers"]["text"].update(widht=64)), r"config field towers.text.widht: not a field of a text tower \(it has activation, class_token, clean, context, depth, end_token, heads, layer_norm_eps, ln_pre, mask, mlp_width, norm, pad_id, pad_to_context, pooler, pooling, positions, projection, token_width, tokenizer, vocab_size, width\)$"),
    "newer format": (lambda p: _with_config(p, lambda c: c.update(format_version=9)), "newer than this uform reads"),
    "geometry vs tensors": (lambda p: _with_config(p, lambda c: c.update(context=64)), "'text.pos.weight': shape \\[33, 64\\].*\\[65, 64\\]"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_checkpoint_raises_naming_the_fault(case: str, tiny_text: Path, tmp_path: Path) -> None:
    make, pattern = CASES[case]
    blob = make(tiny_text)
    with pytest.raises(uform.CheckpointError, match=pattern):
        uform.Model.load_ram_buffer(blob)
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    for quantization in ("bf16", "e4m3", "f32"):  # from a file, the message names it, once, first
        with pytest.raises(uform.CheckpointError, match=pattern if case != "empty" else "the file is empty") as refused:
            uform.Model.load_ram(path, quantization=quantization)
        assert str(refused.value).startswith(f"{path}: ") and str(refused.value).count(str(path)) == 1, str(refused.value)


def test_a_header_of_more_json_tokens_than_the_limit_is_refused_before_it_is_parsed(
    tiny_text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2**19 + 1 empty lists and 2**19 commas: 2**20 + 1 tokens, and '{', ':', '[' around them;
    # parsed, 100 MiB of them held 2.6 GB of Python lists before the entry was refused
    text = b'{"a":[' + b"[]," * (1 << 19) + b"[]]}"
    path = tmp_path / "lists.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text)
    monkeypatch.setattr(safetensors.jsontext, "loads", lambda _: pytest.fail("the header was parsed"))
    limit = r"header holds 1048580 JSON tokens \('\{', '\[', ':', ',' outside strings\), over the limit of 1048576"
    with pytest.raises(uform.CheckpointError, match=f"^{re.escape(str(path))}: not a valid safetensors checkpoint: {limit}"):
        uform.Model.load_ram(path)
    with pytest.raises(uform.CheckpointError, match=limit):
        uform.Model.load_ram_buffer(path.read_bytes())


def test_header_tokens_inside_strings_do_not_count(tiny_text: Path) -> None:
    assert safetensors.json_tokens(b'{"a":[1,2],"b":"x,{[:\\"],"}') == 6  # the string holds an escaped quote
    assert safetensors.json_tokens(b'{"a\\\\":[],"b":"\\\\"}') == 5  # a string ending in an escaped backslash
    # a config string holding 2**20 and more tokens of its own (a tokenizer.json is JSON in a string) loads
    header, data = _raw(tiny_text)
    header["__metadata__"]["tokens"] = json.dumps({"a": [[{"b": ","}] for _ in range(1 << 18)]})
    model = uform.Model.load_ram_buffer(_pack(header, data))
    assert model.describe().dimensions == 32


def test_paths_that_are_not_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such checkpoint file"):
        uform.Model.load_ram(tmp_path / "missing.safetensors")
    with pytest.raises(uform.CheckpointError, match="is a directory"):
        uform.Model.load_ram(tmp_path)
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(uform.CheckpointError, match=f"^{re.escape(str(tmp_path / 'a'))}: cannot open the checkpoint file \\(Too many levels of symbolic links\\)$"):
        uform.Model.load_ram(tmp_path / "a")
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(uform.CheckpointError, match=f"^{re.escape(str(tmp_path / 'file' / 'c'))}: cannot open the checkpoint file \\(Not a directory\\)$"):
        uform.Model.load_ram(tmp_path / "file" / "c")


def test_buffer_kinds_load_alike(tiny_text: Path) -> None:
    blob = tiny_text.read_bytes()
    texts = ["a cat", "a dog on a mat"]
    reference = np.array(uform.Model.load_ram(tiny_text).text_encode(texts, uform.Arena()).embeddings)
    with open(tiny_text, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        for buffer in (blob, bytearray(blob), memoryview(blob), mapped, np.frombuffer(blob, np.uint8)):
            got = uform.Model.load_ram_buffer(buffer).text_encode(texts, uform.Arena()).embeddings
            assert np.array_equal(got, reference), type(buffer)


def test_not_a_buffer() -> None:
    with pytest.raises(TypeError, match="buffer protocol, got int"):
        uform.Model.load_ram_buffer(12)  # type: ignore[arg-type]


def test_load_progress_and_cancel(tiny_text: Path) -> None:
    seen: list[tuple[int, int]] = []
    uform.Model.load_ram(tiny_text, progress=lambda d, t: seen.append((d, t)), progress_steps=4)
    total = seen[-1][1]
    assert seen[-1] == (total, total) and 1 <= len(seen) <= 5
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    with pytest.raises(uform.CancelledError):
        uform.Model.load_ram(tiny_text, progress=lambda d, t: False)


def test_vram_without_a_usable_gpu_is_unsupported_never_cpu(tiny_text: Path) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has the CUDA execution provider; tests/test_cuda_loads.py covers it")
    with pytest.raises(uform.UnsupportedError, match="cannot place a model in VRAM: cuda: .*no CUDAExecutionProvider"):
        uform.Model.load_vram(tiny_text)
    with pytest.raises(uform.UnsupportedError, match="cannot place a model in VRAM"):
        uform.Model.load_vram_buffer(tiny_text.read_bytes())


def test_quantization_not_served(tiny_text: Path) -> None:
    with pytest.raises(uform.UnsupportedError, match="cannot place a model in RAM: .*cpu: holds weights in f32, bf16 or e4m3, not e5m2$"):
        uform.Model.load_ram(tiny_text, quantization=uform.Scalar.E5M2)
    with pytest.raises(ValueError, match="quantization must be one of"):
        uform.Model.load_ram(tiny_text, quantization="int3")  # type: ignore[arg-type]


@pytest.mark.parametrize("modality", ["text", "image", "video", "audio", "choose"])
def test_a_field_its_tower_does_not_have_is_refused_naming_the_tower_and_its_fields(modality: str) -> None:
    # a misspelt tower field ('widht') was ignored and the tower built from its other fields
    tower = get_host().modalities[modality].tower
    config = checkpoint.make_config(64, 32, {tower.name: {**tower.presets["tiny"], "widht": 64}})
    with pytest.raises(uform.CheckpointError, match=rf"^config field towers\.{tower.name}\.widht: not a field of (a|an|the) [\w ]+ \(it has [a-z_, ]+\)$") as refused:
        tower.read(config.towers[tower.name], config)
    assert "width" in str(refused.value).split("(it has ")[1]
