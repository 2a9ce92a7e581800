"""Progress reporting and cancellation, shared by loads and verbs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .errors import CancelledError

ProgressHandler = Callable[[int, int], "bool | None"]


class Progress:
    """Calls ``handler(done, total)`` about ``steps`` times (every advance when ``steps`` is 0).

    A handler that returns ``False`` (or numpy's ``False``) cancels: :meth:`advance` raises
    :class:`~uform.CancelledError`. Any other answer, ``None`` and ``0`` included, goes on.
    """

    def __init__(self, handler: ProgressHandler | None, steps: int, total: int) -> None:
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise ValueError(f"progress_steps must be a non-negative integer, got {steps!r}")
        if handler is not None and not callable(handler):
            raise TypeError(f"progress must be callable as progress(done, total), got {type(handler).__name__}")
        self.handler, self.steps, self.total = handler, steps, total
        self.done = 0
        self._step = 0

    def advance(self, n: int) -> None:
        self.done += n
        if self.handler is None:
            return
        if self.steps and self.done < self.total:
            # Step s is due once done reaches ceil(s * total / steps); the steps passed are
            # floor(done * steps / total), in integers (any count of steps, no loop over them).
            passed = min(self.steps, self.done * self.steps // self.total)
            if passed <= self._step:
                return
            self._step = passed
        answer = self.handler(self.done, self.total)
        if cancels(answer):
            raise CancelledError(f"cancelled by the progress handler at {self.done} of {self.total}; nothing was written")


def cancels(answer: object) -> bool:
    """Whether a progress handler's answer cancels: ``False``, or numpy's ``False`` (what
    ``elapsed < limit`` of numpy values answers); ``None``, ``0`` and the rest go on."""
    return answer is False or (isinstance(answer, np.bool_) and not answer)
