"""open_clip's own checkpoints (``open_clip_config.json`` + ``open_clip_model.safetensors`` or
``open_clip_pytorch_model.bin``, as many LAION and DataComp CLIPs are published) as a uform file.

The mapping is clean for open_clip's plain ``CLIP`` with its own ``VisionTransformer`` and
text transformer: the same math as transformers' ``CLIPModel`` (exact GELU unless
``quick_gelu``), the projections stored as ``[width, dimensions]`` matrices (transposed here),
``nn.MultiheadAttention``'s ``in_proj`` already in q, k, v order. Every other variant (timm or
Hugging Face towers, attentional pooling, layer scale, no causal mask, another pooling, CoCa,
SigLIP-style logit bias, ...) is refused by the config field, or by the tensors it adds.
The tokenizer is the source's ``tokenizer.json`` where there is one (the Hub's LAION
repositories carry it), else OpenAI's CLIP BPE from open_clip_torch's package, made by
transformers' ``CLIPTokenizer`` (open_clip and transformers needed at convert time only).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from uform.core import jsontext

from .common import CLIP_MEAN, CLIP_STD, Converted, Taker, config, geometry, integer, logit_scale, norm, positive, section, triple
from .sources import ConvertError, Weights
from .tokenizer import fits, parse

# fields that change the math, with the one value uform converts
VISION_PLAIN: dict[str, Any] = {
    "ls_init_value": None, "attentional_pool": False, "no_ln_pre": False, "pos_embed_type": "learnable", "pool_type": "tok",
    "act_kwargs": None, "norm_kwargs": None, "block_type": None, "qk_norm": False, "scaled_cosine_attn": False, "scale_heads": False,
    "scale_attn_inner": False, "scale_attn": False, "scale_fc": False, "timm_model_name": None, "global_average_pool": False,
    "input_patchnorm": False,
}  # fmt: skip
TEXT_PLAIN: dict[str, Any] = {
    "ls_init_value": None, "embed_cls": False, "no_causal_mask": False, "pool_type": "argmax", "proj_bias": False, "proj_type": "linear",
    "act_kwargs": None, "norm_kwargs": None, "block_type": None, "qk_norm": False, "scaled_cosine_attn": False, "scale_heads": False,
    "scale_attn_inner": False, "scale_attn": False, "scale_fc": False, "hf_model_name": None,
}  # fmt: skip
MODEL_PLAIN: dict[str, Any] = {"init_logit_bias": None, "multimodal_cfg": None}


def architecture(cfg: dict[str, Any]) -> str:
    model = cfg.get("model_cfg")
    vision = model.get("vision_cfg") if isinstance(model, dict) else None
    if not isinstance(vision, dict):
        vision = {}
    return f"open_clip ViT (width {vision.get('width', '?')}, patch {vision.get('patch_size', '?')}, {vision.get('layers', '?')} layers)"


def _plain(cfg: dict[str, Any], plain: dict[str, Any], where: str) -> None:
    for key, value in plain.items():
        if key in cfg and cfg[key] != value:
            raise ConvertError(f"{where}.{key} = {cfg[key]!r} is not supported (uform converts open_clip's plain CLIP, {key} = {value!r})")


def convert(directory: Path, cfg: dict[str, Any], weights: Weights, source: dict[str, str], frames: int) -> Converted:
    where = str(directory / "open_clip_config.json")
    model = cfg.get("model_cfg")
    if not isinstance(model, dict):
        raise ConvertError(f"{where}: has no model_cfg object")
    vision, text = section(model, "vision_cfg", where + " model_cfg"), section(model, "text_cfg", where + " model_cfg")
    _plain(model, MODEL_PLAIN, where + " model_cfg")
    _plain(vision, VISION_PLAIN, where + " model_cfg.vision_cfg")
    _plain(text, TEXT_PLAIN, where + " model_cfg.text_cfg")
    _tokenizer_kwargs(text, where + " model_cfg.text_cfg")
    act = "quick_gelu" if model.get("quick_gelu") else "gelu"
    dimensions = integer(model, "embed_dim", where + " model_cfg", 512)
    notes: list[str] = []
    prefix = "text." if any(n.startswith("text.token_embedding") for n in weights.names()) else ""  # custom_text
    t = Taker(weights, ignore=lambda n: n in (f"{prefix}attn_mask", "attn_mask"))

    # text
    tw, td = integer(text, "width", where + " text_cfg", 512), integer(text, "layers", where + " text_cfg", 12)
    th = integer(text, "heads", where + " text_cfg", 8)
    tm = int(tw * positive(text, "mlp_ratio", where + " text_cfg", 4.0))
    vocab, context = integer(text, "vocab_size", where + " text_cfg", 49408), integer(text, "context_length", where + " text_cfg", 77)
    why = "open_clip_config.json text_cfg"
    t.take("text.embed.weight", f"{prefix}token_embedding.weight", (vocab, tw), why + ".vocab_size, width")
    t.take("text.pos.weight", f"{prefix}positional_embedding", (context, tw), why + ".context_length, width")
    _stack(t, f"{prefix}transformer", "text", tw, td, tm, why)
    norm(t, "text.ln_final", f"{prefix}ln_final", tw, why)
    t.put("text.projection.weight", t.get(f"{prefix}text_projection", (tw, dimensions), why + ".width, embed_dim").T.copy())
    tokenizer, pad_id = _tokenizer(directory, text, vocab, notes)
    text_tower = geometry(tw, td, th, tm, where + " text_cfg") | {
        "token_width": 0, "activation": act, "layer_norm_eps": 1e-5, "class_token": False, "pooling": "last_token",
        "projection": "linear", "tokenizer": "tokenizer.json", "vocab_size": vocab, "context": context, "mask": "causal",
        "pad_to_context": False, "pad_id": pad_id, "clean": "whitespace" if text.get("hf_tokenizer_name") else "lower",
        "end_token": "max",  # open_clip's text pool_type 'argmax'
    }  # fmt: skip

    # image
    if not isinstance(vision.get("layers", 12), int):
        raise ConvertError(f"{where} model_cfg.vision_cfg.layers = {vision.get('layers')!r}: a ResNet tower is not supported (ViT only)")
    vw, vd = integer(vision, "width", where + " vision_cfg", 768), integer(vision, "layers", where + " vision_cfg", 12)
    head_width = integer(vision, "head_width", where + " vision_cfg", 64)
    vm = int(vw * positive(vision, "mlp_ratio", where + " vision_cfg", 4.0))
    size, patch = vision.get("image_size", 224), vision.get("patch_size", 16)
    if isinstance(size, list) and len(size) == 2 and size[0] == size[1]:
        size = size[0]
    bad = not isinstance(size, int) or not isinstance(patch, int) or isinstance(patch, bool) or patch < 1 or size < patch
    if bad or vw % head_width:  # S % P != 0: conv1 (stride P, no padding) leaves the last rows and columns out, as patch_remainder 'drop'
        raise ConvertError(f"{where} model_cfg.vision_cfg: image_size {size!r}, patch_size {patch!r}, width {vw}, head_width {head_width} are not supported (a square image at least one patch wide, heads dividing the width)")
    grid = size // patch
    why = "open_clip_config.json vision_cfg"
    t.take("image.patch.weight", "visual.conv1.weight", (vw, 3, patch, patch), why + ".width, patch_size", (vw, 3 * patch * patch))
    t.put("image.patch.bias", np.zeros(vw, np.float32))
    t.take("image.cls", "visual.class_embedding", (vw,), why + ".width")
    t.take("image.pos.weight", "visual.positional_embedding", (1 + grid * grid, vw), why + ".image_size, patch_size")
    norm(t, "image.ln_pre", "visual.ln_pre", vw, why)
    _stack(t, "visual.transformer", "image", vw, vd, vm, why)
    norm(t, "image.ln_final", "visual.ln_post", vw, why)
    t.put("image.projection.weight", t.get("visual.proj", (vw, dimensions), why + ".width, embed_dim").T.copy())
    image = geometry(vw, vd, vw // head_width, vm, where + " vision_cfg") | {
        "activation": act, "layer_norm_eps": 1e-5, "class_token": True, "ln_pre": True, "pooling": "class", "projection": "linear",
        "image_size": size, "patch_size": patch, **({"patch_remainder": "drop"} if size % patch else {}),
    } | _preprocess(section(cfg, "preprocess_cfg", where), where)  # fmt: skip

    scale = logit_scale(t)
    tensors = t.finish()
    towers = {"text": text_tower, "image": image, "video": {"from": "image", "frames": frames}}
    out = config(dimensions, context, towers, source, {"kind": "softmax", "scale": scale, "bias": 0.0})
    return Converted(out, tensors, tokenizer, notes, list(weights.files))


def _stack(t: Taker, source: str, target: str, width: int, depth: int, mlp: int, why: str) -> None:
    for i in range(depth):
        s, d = f"{source}.resblocks.{i}", f"{target}.blocks.{i}"
        t.take(f"{d}.attn.qkv.weight", f"{s}.attn.in_proj_weight", (3 * width, width), why)
        t.take(f"{d}.attn.qkv.bias", f"{s}.attn.in_proj_bias", (3 * width,), why)
        for a, b, shape in (("attn.out_proj", "attn.out", (width, width)), ("mlp.c_fc", "mlp.fc1", (mlp, width)), ("mlp.c_proj", "mlp.fc2", (width, mlp))):
            t.take(f"{d}.{b}.weight", f"{s}.{a}.weight", shape, why)
            t.take(f"{d}.{b}.bias", f"{s}.{a}.bias", (shape[0],), why)
        norm(t, f"{d}.ln1", f"{s}.ln_1", width, why)
        norm(t, f"{d}.ln2", f"{s}.ln_2", width, why)


def _preprocess(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    interpolation = cfg.get("interpolation", "bicubic")
    resize = {"shortest": "shorter_side_crop", "squash": "square"}.get(cfg.get("resize_mode", "shortest"))
    if interpolation not in ("bicubic", "bilinear") or resize is None:
        raise ConvertError(f"{where} preprocess_cfg: interpolation {interpolation!r} / resize_mode {cfg.get('resize_mode')!r} are not supported (bicubic or bilinear; shortest or squash)")
    mean, std = cfg.get("mean", CLIP_MEAN), cfg.get("std", CLIP_STD)
    # torchvision: int(S * long / short), CenterCrop at int(round((T - S) / 2))
    rounding = {"resize_rounding": "floor", "crop_rounding": "half_even"} if resize == "shorter_side_crop" else {}
    at = where + " preprocess_cfg"
    fields = {"resize": resize, "interpolation": interpolation, "alpha": "drop"}  # open_clip: resize and crop, then image.convert("RGB")
    return rounding | fields | {"mean": triple(mean, at, "mean", -math.inf), "std": triple(std, at, "std", 0.0)}


def _tokenizer_kwargs(text: dict[str, Any], where: str) -> None:
    """open_clip's tokenizer takes ``text_cfg.tokenizer_kwargs`` (``clean``, ``reduction_mask``,
    ``strip_sep_token``, ...); uform converts its defaults only, each other value refused by name."""
    kwargs = text.get("tokenizer_kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise ConvertError(f"{where}.tokenizer_kwargs = {kwargs!r} is not an object")
    hf = bool(text.get("hf_tokenizer_name"))  # open_clip's HFTokenizer, else its SimpleTokenizer (CLIP's BPE)
    default: dict[str, Any] = {"clean": "whitespace", "strip_sep_token": False, "language": None} if hf else {"clean": "lower", "reduction_mask": ""}
    for key, value in kwargs.items():
        if key not in default or value != default[key] and not (key == "reduction_mask" and value is None):
            accepted = ", ".join(f"{k} = {v!r}" for k, v in default.items())
            raise ConvertError(f"{where}.tokenizer_kwargs.{key} = {value!r} is not supported (uform converts open_clip's default {'HFTokenizer' if hf else 'SimpleTokenizer'}: {accepted})")
    if text.get("tokenizer_mode") is not None:
        raise ConvertError(f"{where}.tokenizer_mode = {text['tokenizer_mode']!r} is not supported (uform converts open_clip's default tokenizer)")


def _tokenizer(directory: Path, text: dict[str, Any], vocab: int, notes: list[str]) -> tuple[str, int]:
    path = directory / "tokenizer.json"
    if path.is_file():
        value = path.read_text(encoding="utf-8")
        notes.append("tokenizer.json from the source directory")
    elif text.get("hf_tokenizer_name"):
        raise ConvertError(f"{directory}: the text tower's tokenizer is {text['hf_tokenizer_name']!r}; add its tokenizer.json to the directory")
    else:
        value = _clip_bpe(directory)
        notes.append("tokenizer.json: OpenAI's CLIP BPE from open_clip_torch's package, by transformers' CLIPTokenizer")
    tok = parse(value, str(path))
    fits(tok, vocab, str(path), "open_clip_config.json text_cfg.vocab_size")
    end = tok.token_to_id("<|endoftext|>")
    if not text.get("hf_tokenizer_name"):
        value = _simple_specials(value, notes)
        fits(parse(value, str(path)), vocab, str(path), "open_clip_config.json text_cfg.vocab_size")
    return value, int(end) if end is not None else 0


SIMPLE_SPECIALS = {"<|startoftext|>": "<start_of_text>", "<|endoftext|>": "<end_of_text>"}


def _simple_specials(value: str, notes: list[str]) -> str:
    """CLIP's ``tokenizer.json`` with its special tokens named as open_clip's SimpleTokenizer names
    them (``<start_of_text>``, ``<end_of_text>``; same ids): a text holding ``<end_of_text>`` is
    its end token there and ``<|endoftext|>`` plain text, where CLIP's names are the other way
    round. The names change in the added tokens, the BPE vocabulary, the pre-tokenizer's split
    pattern and the post-processor; a tokenizer without CLIP's names is kept as it is."""
    import json

    data = jsontext.loads(value)  # parsed by the tokenizers library already
    added = data.get("added_tokens") if isinstance(data, dict) else None
    if not isinstance(added, list) or {a.get("content") for a in added if isinstance(a, dict)} != set(SIMPLE_SPECIALS):
        notes.append("tokenizer.json: special tokens other than CLIP's two kept as they are (open_clip's SimpleTokenizer names <start_of_text> and <end_of_text>)")
        return value
    for token in added:
        token["content"] = SIMPLE_SPECIALS[token["content"]]
    model = data.get("model")
    if isinstance(model, dict) and isinstance(model.get("vocab"), dict):
        model["vocab"] = {SIMPLE_SPECIALS.get(k, k): i for k, i in model["vocab"].items()}
    text = json.dumps(data, ensure_ascii=False)
    for old, new in SIMPLE_SPECIALS.items():  # as JSON text: the split pattern and the post-processor's names
        text = text.replace(json.dumps(re.escape(old))[1:-1], new).replace(json.dumps(old), json.dumps(new))
    return text


def _clip_bpe(directory: Path) -> str:
    import gzip
    import importlib.util
    import json
    import tempfile

    spec = importlib.util.find_spec("open_clip")
    try:
        from transformers import CLIPTokenizer
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ConvertError(f"{directory}: no tokenizer.json; making CLIP's needs open_clip_torch and transformers at convert time (pip install open_clip_torch transformers), or add a tokenizer.json")
    bpe = Path(list(spec.submodule_search_locations)[0]) / "bpe_simple_vocab_16e6.txt.gz"
    lines = gzip.open(bpe).read().decode("utf-8").split("\n")[1 : 49152 - 256 - 2 + 1]
    merges = [line.split() for line in lines]
    chars = _bytes_to_unicode()
    vocab = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vocab.json").write_text(json.dumps({v: i for i, v in enumerate(vocab)}), encoding="utf-8")
        (Path(tmp) / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n", encoding="utf-8")
        tok: Any = CLIPTokenizer(str(Path(tmp) / "vocab.json"), str(Path(tmp) / "merges.txt"))
        return str(tok.backend_tokenizer.to_str())


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte-to-character table (the characters of CLIP's BPE), in byte order of the table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]
