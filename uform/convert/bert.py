"""What the BERT-family text towers share (RoBERTa in CLAP, BERT in Chinese-CLIP): the encoder's
post-norm layers as a uform stack, and the tokenizer's cut."""

from __future__ import annotations

from pathlib import Path

from .common import Taker, norm
from .sources import read_json


def bert_stack(t: Taker, source: str, target: str, width: int, depth: int, mlp: int, why: str) -> None:
    """BERT's encoder layers ``{source}.encoder.layer.i`` (post-norm: ``attention.output.LayerNorm``
    after the attention's residual add, ``output.LayerNorm`` after the MLP's) as ``{target}.blocks.i``."""
    for i in range(depth):
        s, d = f"{source}.encoder.layer.{i}", f"{target}.blocks.{i}"
        a = f"{s}.attention"
        t.stack(f"{d}.attn.qkv.weight", [f"{a}.self.{x}.weight" for x in ("query", "key", "value")], (width, width), why)
        t.stack(f"{d}.attn.qkv.bias", [f"{a}.self.{x}.bias" for x in ("query", "key", "value")], (width,), why)
        for src, dst, shape in ((f"{a}.output.dense", "attn.out", (width, width)), (f"{s}.intermediate.dense", "mlp.fc1", (mlp, width)), (f"{s}.output.dense", "mlp.fc2", (width, mlp))):
            t.take(f"{d}.{dst}.weight", f"{src}.weight", shape, why + ".hidden_size, intermediate_size")
            t.take(f"{d}.{dst}.bias", f"{src}.bias", (shape[0],), why + ".hidden_size, intermediate_size")
        norm(t, f"{d}.ln1", f"{a}.output.LayerNorm", width, why)
        norm(t, f"{d}.ln2", f"{s}.output.LayerNorm", width, why)


def model_max_length(directory: Path) -> int | None:
    """``tokenizer_config.json``'s ``model_max_length`` (what ``truncation=True`` cuts at), where it is a sane integer."""
    path = directory / "tokenizer_config.json"
    value = read_json(path).get("model_max_length") if path.is_file() else None
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 20 else None
