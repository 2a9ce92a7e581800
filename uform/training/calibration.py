"""The end of a run, through the runtime: the choice temperatures fitted on fresh questions
(:func:`calibrate`), and both suites read with BF16 and with E4M3 weights (:func:`evaluate_all`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from uform import Model, Scalar
from uform.calibrate import Example
from uform.calibrate import calibrate as fit
from uform.demo import evaluate, foreign
from uform.demo.variety.questions import question as varied_question
from uform.demo.evaluate import CALIBRATION_STREAM

from .settings import Settings


def calibrate(raw: Path, out: Path, settings: Settings, log: Callable[[str], None]) -> tuple[float, ...]:
    """Fit the temperatures of the three question groups through the runtime on fresh questions."""
    rng = np.random.default_rng([CALIBRATION_STREAM, settings.seed])
    asked = [varied_question(rng, calibration=True) for _ in range(settings.calibration_examples)]
    examples = [Example(q.text, q.choices, q.answer, q.group) for q in asked]
    report = fit(raw, examples, out, holdout=0.25, seed=settings.seed, groups=3, smoothing=settings.smoothing)
    log(f"calibration: temperatures {[round(t, 4) for t in report.temperatures]}, held-out ECE "
        f"{report.ece_before:.4f} -> {report.ece_after:.4f}, accuracy {report.accuracy:.4f}")  # fmt: skip
    return report.temperatures


def evaluate_all(path: Path, seed: int, log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Both suites (``uform.demo.evaluate``, ``uform.demo.foreign.evaluate``) of the checkpoint
    with BF16 and with E4M3 weights: keys ``own bf16``, ``foreign bf16``, ``own e4m3``, ``foreign e4m3``."""
    out = {}
    for quantization in (Scalar.BF16, Scalar.E4M3):
        model = Model.load_ram(path, quantization=quantization)
        try:
            for suite, run in (("own", evaluate), ("foreign", foreign.evaluate)):
                figures = run(model, seed=seed).as_dict()
                out[f"{suite} {quantization.value}"] = figures
                log(f"evaluation ({suite}, {quantization.value}): "
                    + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()))  # fmt: skip
        finally:
            model.close()
    return out
