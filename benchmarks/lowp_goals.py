"""The AVX2 goals (BF16 and E4M3 weights against the float32 path they replaced) and the AMX
goals (against OpenVINO, PyTorch and the float32 path), read from one ``lowp.py`` run's results:
each goal, the figures it is judged by, and whether they meet it.

Each goal reads the rows that measure it fairly: batch 1 from the runs called in turns in one
process (runs in processes of their own, minutes apart, drift), the short query likewise, batch
64 from the runs in processes of their own, the kernels' share of the peak measured in the
same run, and the full load over the read in the load's own process. On a machine above
x86-64-v3 the AVX2 kernels run pinned (``[x86-64-v3]``) against a float32 path that still uses
AVX-512: the goals are set for AVX2-only machines, where the float32 path is AVX2 too.
``image_encode`` against transformers is ``benchmarks/media.py``'s to measure.
"""

from __future__ import annotations

from typing import Any

PINNED = " [x86-64-v3]"
TOWERS = ("text:small", "text:base", "image:base")  # the towers the goals are set for
QUERY_TOWER = "text:base"  # the short query's


def number(text: Any) -> float | None:
    """``1.24x`` or ``91 %`` as a number (None for an empty cell or words such as ``no probe``)."""
    try:
        return float(str(text).strip().rstrip("x%").strip())
    except ValueError:
        return None


def goals(results: dict[str, Any], pinned: bool, variant: str | None) -> list[dict[str, str]]:
    """Rows of goal, measured, met (``yes``, ``no``, or ``not run`` where the run lacked the
    part or the goal's towers: ``TOWERS``, the short query on ``QUERY_TOWER``). ``pinned``: the AVX2 runs are the ``[x86-64-v3]`` ones; ``variant``: the kernels
    x86-64-v3 runs on this machine (``avx2`` or ``avx2-split``; None without the op library)."""
    suffix = PINNED if pinned else ""
    bf16, e4m3 = f"uform bf16{suffix}", f"uform e4m3{suffix}"

    def per_tower(rows: list[dict[str, Any]], run: str, key: str) -> dict[str, float | None]:
        return {r["tower"]: number(r.get(key, "")) for r in rows if r.get("run") == run and r.get("tower") in TOWERS}

    def query(run: str) -> dict[str, float | None]:
        if results.get("query_tower") != QUERY_TOWER:
            return {}
        return {"": number(r.get("12 B vs f32", "")) for r in results.get("queries_interleaved", []) if r["run"] == run}

    def kernel(weights: str) -> dict[str, float | None]:
        rows = results.get("kernels", [])
        return {"": number(r["of peak"]) for r in rows if r["variant"] == variant and r["weights"] == weights and r["m"] == 5568}

    def full(run: str) -> dict[str, float | None]:
        rows = [r for r in results.get("full_load", []) if r["run"] == run]
        return {key: number(r.get(key, "")) for r in rows for key in ("load/read", "load/read in turns")}

    checks = [
        ("BF16 >= 1.0x the float32 path at batch 1, every tower (in turns)", per_tower(results.get("turns", []), bf16, "vs f32 @1"), 1.0, "x", 1),
        ("E4M3 >= 0.95x at batch 1 (in turns)", per_tower(results.get("turns", []), e4m3, "vs f32 @1"), 0.95, "x", 1),
        ("BF16 >= 1.0x at batch 64", per_tower(results.get("runs", []), bf16, "vs f32 @64"), 1.0, "x", 1),
        ("E4M3 >= 0.95x at batch 64", per_tower(results.get("runs", []), e4m3, "vs f32 @64"), 0.95, "x", 1),
        ("12-byte query: BF16 >= 1.3x (in turns)", query(bf16), 1.3, "x", 1),
        ("12-byte query: E4M3 >= 1.4x (in turns)", query(e4m3), 1.4, "x", 1),
        (f"kernel ({variant}) at 5,568 rows: BF16 >= 88 % of the FMA peak", kernel("bf16"), 88.0, " %", 1),
        (f"kernel ({variant}) at 5,568 rows: E4M3 >= 85 %", kernel("e4m3"), 85.0, " %", 1),
        ("BF16 load of the full base checkpoint <= 2.0x the read", full(bf16), 2.0, "x", -1),
    ]
    return verdicts(checks)


Check = tuple[str, dict[str, float | None], float, str, int]  # goal, measured (by tower), bound, unit, sense


def verdicts(checks: list[Check]) -> list[dict[str, str]]:
    """Each check as a row: its goal, what was measured, met or not (``not run`` where nothing was)."""
    rows = []
    for goal, measured, bound, unit, sense in checks:  # sense: 1 at least the bound, -1 at most
        values = {k: v for k, v in measured.items() if v is not None}
        shown = ", ".join(f"{k} {v:.2f}x".lstrip() if unit == "x" else f"{k} {v:.0f} %".lstrip() for k, v in values.items())
        met = "not run" if not values else "yes" if all(sense * (v - bound) >= 0 for v in values.values()) else "no"
        rows.append({"goal": goal, "measured": shown or "-", "met": met})
    return rows


AMX_TOWERS = ("text:base", "image:base")  # the towers of the AMX goals (images at batch 64 here; media.py: 16)
OPENVINO = "openvino bf16"


def amx_goals(results: dict[str, Any]) -> list[dict[str, str]]:
    """The AMX goals (issue 48), read from a run with OpenVINO's rows: BF16 against OpenVINO bf16
    (in processes of their own: OpenVINO cannot share a process with the turns), PyTorch BF16
    autocast and the float32 path (in turns at batch 1), E4M3 against BF16, the short queries
    against OpenVINO, and the amx kernels' share of the tile peak at 5,568 rows."""
    runs = results.get("runs", [])

    def items(run: str, batch: int, towers: Any) -> dict[str, float | None]:
        return {r["tower"]: number(r.get(f"items/s @{batch}", "")) for r in runs if r.get("run") == run and r.get("tower") in towers}

    def over(a: dict[str, float | None], b: dict[str, float | None]) -> dict[str, float | None]:
        return {t: (a[t] / b[t] if a.get(t) and b.get(t) else None) for t in a}  # type: ignore[operator]

    bf16_64, e4m3_64, ov_64, torch_64 = (items(run, 64, AMX_TOWERS) for run in ("uform bf16", "uform e4m3", OPENVINO, "torch bf16 autocast"))
    turns = {r["tower"]: number(r.get("vs f32 @1", "")) for r in results.get("turns", []) if r.get("run") == "uform bf16" and r.get("tower") in AMX_TOWERS}
    queries = [r for r in results.get("queries", []) if r.get("tower") == "text:base"]

    def query(run: str) -> dict[str, float | None]:
        return {name: number(r.get(f"{name} vs openvino bf16", "")) for r in queries if r["run"] == run for name in ("12 B", "8 x 12 B", "52 B")}

    def kernel(weights: str) -> dict[str, float | None]:
        rows = results.get("kernels", [])
        return {"": number(r["of peak"]) for r in rows if r["variant"] == "amx" and r["weights"] == weights and r["m"] == 5568}

    checks: list[Check] = [
        ("BF16 >= 1.0x OpenVINO bf16 at batch 64", over(bf16_64, ov_64), 1.0, "x", 1),
        ("BF16 >= 1.5x PyTorch BF16 autocast at batch 64", over(bf16_64, torch_64), 1.5, "x", 1),
        ("E4M3 >= 0.95x BF16 at batch 64", over(e4m3_64, bf16_64), 0.95, "x", 1),
        ("BF16 >= 1.0x OpenVINO bf16 at batch 1", over(items("uform bf16", 1, AMX_TOWERS), items(OPENVINO, 1, AMX_TOWERS)), 1.0, "x", 1),
        ("BF16 >= 2.0x the float32 path at batch 1 (in turns)", turns, 2.0, "x", 1),
        ("short queries (text:base): BF16 >= 1.0x OpenVINO bf16", query("uform bf16"), 1.0, "x", 1),
        ("short queries (text:base): E4M3 >= 1.2x OpenVINO bf16", query("uform e4m3"), 1.2, "x", 1),
        ("kernel (amx) at 5,568 rows: BF16 >= 50 % of the tile peak", kernel("bf16"), 50.0, " %", 1),
        ("kernel (amx) at 5,568 rows: E4M3 >= 45 % of the tile peak", kernel("e4m3"), 45.0, " %", 1),
    ]
    return verdicts(checks)
