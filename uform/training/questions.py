"""The byte decoder's questions and losses: the decoder phase's questions, the held-out ones it
is read on, the next-byte and answer cross-entropies (padded, or packed into rows), and the
fraction answered right.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import numpy as np
import torch
import torch.nn.functional as F

from uform.demo import generate as g
from uform.demo.variety.decoder import decoder_question
from uform.demo.variety.questions import question as varied_question
from uform.demo.evaluate import HELDOUT_STREAM
from uform.exporters.reference.blocks import causal_mask
from uform.exporters.reference.decoder import BEGIN, DecoderTower


def decoder_loss(tower: DecoderTower, questions: list[g.Question]) -> tuple[torch.Tensor, float]:
    """Next-byte cross-entropy over each question and its answer byte, plus the answer byte's
    own cross-entropy (the one ``text_choose`` reads); and the fraction answered right."""
    seqs = [(q.text + q.choices[q.answer]).encode()[-tower.context :] for q in questions]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    ids[:, 0] = BEGIN
    targets = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, 1 : len(s)] = torch.tensor(list(s[:-1]))
        targets[i, : len(s)] = torch.tensor(list(s))
    hidden = tower.run(tower.embed(ids) + tower.pos.weight[:width], causal_mask(width))
    logits = tower.head(hidden)  # [B, T, 256]: position j predicts byte j
    modelled = F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1), ignore_index=-100)
    last = logits[torch.arange(len(seqs)), torch.tensor([len(s) - 1 for s in seqs])]
    answer = F.cross_entropy(last, torch.tensor([s[-1] for s in seqs]))
    right = sum(int(int(torch.argmax(last[i, [ord(c) for c in q.choices]])) == q.answer) for i, q in enumerate(questions))
    return modelled + answer, right / len(questions)


def decoder_questions(rng: np.random.Generator, n: int, context: int) -> list[g.Question]:
    """``n`` questions for the decoder phase: ``generate.question`` (0.2), ``variety.questions.question``
    with jumbles (0.2) and ``variety.decoder.decoder_question`` (0.6); a question whose text would not
    fit the decoder's context (the runtime would cut its description off) is drawn again."""
    out: list[g.Question] = []
    while len(out) < n:
        u = rng.random()
        q = g.question(rng) if u < 0.2 else varied_question(rng, jumbled=0.35) if u < 0.4 else decoder_question(rng)
        if len(q.text.encode()) < context:
            out.append(q)
    return out


def _packed(tower: DecoderTower, questions: list[g.Question], row: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The packed forward of :func:`packed_decoder_loss`: the next-byte cross-entropy over every
    byte, the logits after each question (in ``questions``' order, ``[N, 256]``) and the answer bytes."""
    seqs = [(q.text + q.choices[q.answer]).encode()[-tower.context :] for q in questions]
    rows: list[list[int]] = []
    fill: list[int] = []
    for i in sorted(range(len(seqs)), key=lambda i: -len(seqs[i])):
        for r, used in enumerate(fill):
            if used + len(seqs[i]) <= row:
                rows[r].append(i)
                fill[r] += len(seqs[i])
                break
        else:
            rows.append([i])
            fill.append(len(seqs[i]))
    width = max(fill)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    positions = torch.zeros(len(rows), width, dtype=torch.long)
    targets = torch.full((len(rows), width), -100, dtype=torch.long)
    segment = torch.full((len(rows), width), -1, dtype=torch.long)
    ends: list[tuple[int, int]] = [(0, 0)] * len(seqs)
    for r, members in enumerate(rows):
        at = 0
        for k, i in enumerate(members):
            s, n = seqs[i], len(seqs[i])
            ids[r, at] = BEGIN
            ids[r, at + 1 : at + n] = torch.tensor(list(s[:-1]))
            targets[r, at : at + n] = torch.tensor(list(s))
            positions[r, at : at + n] = torch.arange(n)
            segment[r, at : at + n] = k
            ends[i] = (r, at + n - 1)
            at += n
    allowed = (segment[:, :, None] == segment[:, None, :]) & torch.ones(width, width, dtype=torch.bool).tril()
    allowed |= torch.eye(width, dtype=torch.bool)  # padding attends to itself (its outputs are never read)
    mask = torch.zeros(len(rows), 1, width, width).masked_fill(~allowed[:, None], -1e9)
    logits = tower.head(tower.run(tower.embed(ids) + tower.pos.weight[positions], mask))
    modelled = F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1), ignore_index=-100)
    where = torch.tensor(ends)
    return modelled, logits[where[:, 0], where[:, 1]], torch.tensor([s[-1] for s in seqs])


def packed_decoder_loss(tower: DecoderTower, questions: list[g.Question], row: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`decoder_loss`'s two cross-entropies (every next byte, and the answer byte), with
    the questions packed into rows of up to ``row`` bytes (longest first, first fit), each
    question with its own positions from 0 and attending to itself alone: the same losses as
    one padded row each, with less padding. Answers (their sum, the answer byte's alone)."""
    modelled, last, answers = _packed(tower, questions, row)
    answer = F.cross_entropy(last, answers)
    return modelled + answer, answer


def packed_decoder_step(tower: DecoderTower, questions: list[g.Question], row: int = 128) -> tuple[torch.Tensor, float]:
    """:func:`decoder_loss` (its loss and the fraction answered right) with the questions packed
    as :func:`packed_decoder_loss` packs them: the first phase's decoder step."""
    modelled, last, answers = _packed(tower, questions, row)
    right = sum(int(int(torch.argmax(last[i, [ord(c) for c in q.choices]])) == q.answer) for i, q in enumerate(questions))
    return modelled + F.cross_entropy(last, answers), right / max(len(questions), 1)


def decoder_accuracy(tower: DecoderTower, questions: Sequence[g.Question]) -> float:
    """The fraction of ``questions`` whose most likely choice byte (after the question) is the right one."""
    right = 0
    with torch.no_grad():
        for i in range(0, len(questions), 200):
            chunk = questions[i : i + 200]
            logits = tower.logits([q.text.encode() for q in chunk])
            right += sum(int(int(torch.argmax(logits[j, [ord(c) for c in q.choices]])) == q.answer) for j, q in enumerate(chunk))
    return right / max(len(questions), 1)


@functools.lru_cache(maxsize=4)
def heldout_questions(seed: int, n: int = 400) -> Mapping[str, tuple[g.Question, ...]]:
    """Questions of stream ``[6, seed, 1]`` (no training or calibration draws from it), for
    reading a decoder before either suite: canonical, as the first phase phrases them, as the
    decoder phase does, in the calibration's phrasings (never trained), and lettered options
    in the first phase's phrasings listed in a random order (``options in any order``: the
    seventh run's decoder read 0.455 of them, docs/notes/training-history.md), and of those the lists of all
    six colours (``six options in any order``: where decoders that find three options read
    0.34-0.57 and the shipped one 0.90). Each kind is drawn after the ones before it, so a
    kind added last leaves the others' questions as they were. Drawn once a process for each
    ``(seed, n)``: the decoder phase and the reading stage read the same ones."""
    rng = np.random.default_rng([HELDOUT_STREAM, seed, 1])

    def lettered(options: int = 0) -> g.Question:
        while (q := varied_question(rng, jumbled=0.35, shuffled=1.0)).group != g.LETTERS or len(q.choices) < options:
            pass
        return q

    makers: dict[str, Callable[[], g.Question]] = {
        "canonical": lambda: g.question(rng), "training": lambda: varied_question(rng, jumbled=0.35),
        "decoder phase": lambda: decoder_question(rng), "unseen phrasings": lambda: varied_question(rng, calibration=True),
        "options in any order": lettered, "six options in any order": lambda: lettered(6),
    }  # fmt: skip
    return MappingProxyType({name: tuple(make() for _ in range(n)) for name, make in makers.items()})
