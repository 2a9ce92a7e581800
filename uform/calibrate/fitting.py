"""The math of a calibration, numpy only, on ragged rows (an example's choices a row: values
flat, ``offsets`` [rows + 1]): the softmax at a temperature per row, NLL, the top choice, ECE,
and the NLL-minimising temperature of each group found by bisection."""

from __future__ import annotations

import numpy as np

__all__ = ["ITERATIONS", "T_MAX", "T_MIN", "ece", "fit_temperatures", "nll", "scaled", "softmax", "sub_rows", "top_choice"]

T_MIN, T_MAX = 1e-3, 1e3
ITERATIONS = 64  # bisection steps on log(1/T): 2^-64 of a 13.8-wide bracket


def softmax(z: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    owner = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    e = np.exp(z - np.maximum.reduceat(z, offsets[:-1])[owner])
    return e / np.add.reduceat(e, offsets[:-1])[owner]  # type: ignore[no-any-return]


def scaled(logits: np.ndarray, offsets: np.ndarray, row_temperatures: np.ndarray) -> np.ndarray:
    return logits / np.repeat(row_temperatures, np.diff(offsets))  # type: ignore[no-any-return]


def nll(logits: np.ndarray, offsets: np.ndarray, answers: np.ndarray, row_temperatures: np.ndarray) -> float:
    """Mean negative log-likelihood of the answers under ``softmax(logits / T)`` per row."""
    p = softmax(scaled(logits, offsets, row_temperatures), offsets)
    return float(-np.log(np.maximum(p[offsets[:-1] + answers], 1e-300)).mean())


def top_choice(probs: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per row, the index (within the row) of its most probable choice; the first on ties."""
    starts = offsets[:-1]
    owner = np.repeat(np.arange(len(starts)), np.diff(offsets))
    is_top = probs == np.maximum.reduceat(probs, starts)[owner]
    return np.minimum.reduceat(np.where(is_top, np.arange(len(probs)) - starts[owner], len(probs)), starts)


def ece(probs: np.ndarray, offsets: np.ndarray, answers: np.ndarray, bins: int = 15) -> float:
    """Expected calibration error of the top choice: ``Σ_b (n_b / N) |accuracy_b − confidence_b|``
    over ``bins`` equal-width confidence bins (a confidence of exactly 1 goes in the last)."""
    if len(offsets) < 2:
        return 0.0
    confidence = np.maximum.reduceat(probs, offsets[:-1])
    correct = (top_choice(probs, offsets) == answers).astype(np.float64)
    which = np.minimum(np.floor(confidence * float(bins)), bins - 1)  # float: no int64 overflow for any bins
    # the occupied bins only (at most one a row): a count array of every bin took 8 bytes a bin,
    # 7.9 GB and 55 s for --bins 1000000000
    gap = np.bincount(np.unique(which, return_inverse=True)[1].ravel(), correct - confidence)  # n_b (accuracy_b - confidence_b)
    return float(np.abs(gap).sum() / len(correct))


def fit_temperatures(
    logits: np.ndarray, offsets: np.ndarray, answers: np.ndarray, groups: np.ndarray, count: int, *, smoothing: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The NLL-minimising temperature of each of ``count`` groups, and its example count.

    A group without examples (or whose examples all have one choice) answers 1.0. The
    slope ``Σ p_j (z_j − z_answer)`` is summed as gaps so that it does not cancel to 0 early.
    With ``smoothing``, each label of a group of ``n`` examples puts ``1 / (n + 2)`` of its
    weight evenly on the wrong choices (Laplace's rule of succession: after ``n`` right
    answers of ``n``, the next is right with probability ``(n + 1) / (n + 2)``), so a group
    the model answers all right gets a finite temperature instead of the floor.
    """
    if len(offsets) < 2:
        return np.ones(count), np.zeros(count, np.int64)
    sizes = np.diff(offsets)
    owner = np.repeat(np.arange(len(sizes)), sizes)
    gaps = logits - logits[offsets[:-1] + answers][owner]  # each choice's logit minus the answer's
    pull = np.zeros(count)  # the smoothed labels' own term of the slope: ε_g Σ_wrong gap / (k - 1), summed per group
    if smoothing:
        epsilon = 1 / (np.bincount(groups, minlength=count) + 2.0)
        wrong = np.add.reduceat(gaps, offsets[:-1]) / np.maximum(sizes - 1, 1)  # the answer's own gap is 0
        pull = np.asarray(np.bincount(groups, epsilon[groups] * wrong, minlength=count), np.float64)
    lo, hi = np.full(count, np.log(1 / T_MAX)), np.full(count, np.log(1 / T_MIN))
    for _ in range(ITERATIONS):
        mid = (lo + hi) / 2
        beta = np.exp(mid)[groups]
        p = softmax(logits * beta[owner], offsets)
        slope = np.bincount(groups, np.add.reduceat(p * gaps, offsets[:-1]), minlength=count) - pull  # d NLL / d beta
        up = slope <= 0  # flat (to float precision) means sharper is no worse
        lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
    counts = np.bincount(groups, minlength=count)
    informative = np.bincount(groups, sizes > 1, minlength=count) > 0
    temperatures = np.clip(1 / np.exp((lo + hi) / 2), T_MIN, T_MAX)
    return np.where(informative, temperatures, 1.0), counts


def sub_rows(logits: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ragged sub-tape of ``rows`` (in the order given)."""
    counts = np.diff(offsets)[rows]
    new = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(counts, out=new[1:])
    take = np.repeat(offsets[rows], counts) + np.arange(int(new[-1])) - np.repeat(new[:-1], counts)
    return logits[take], new
