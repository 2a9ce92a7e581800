"""``Life``: the open-or-closed state a ``Model`` shares with its receivers."""

from __future__ import annotations

import threading
from collections import Counter


class Life:
    """Whether a model (and every receiver made from it) is open, and which threads run calls."""

    def __init__(self, owns_executor: bool) -> None:
        self.owns_executor = owns_executor
        self.closed = False
        self._calls: Counter[int] = Counter()  # thread id -> calls it is running
        self._changed = threading.Condition()

    def enter(self) -> None:
        with self._changed:
            if self.closed:
                raise ValueError("this Model was closed (Model.close() or the end of its with block); load it again to use it")
            self._calls[threading.get_ident()] += 1

    def leave(self) -> None:
        with self._changed:
            me = threading.get_ident()
            self._calls[me] -= 1
            if self._calls[me] <= 0:
                del self._calls[me]
            self._changed.notify_all()

    def close(self) -> bool:
        """Refuse new calls and wait for those running; False when it was closed already.

        Called from inside one of the model's own calls (a progress handler), it would wait for
        itself: it raises ``RuntimeError`` instead and leaves the model open.
        """
        with self._changed:
            if self.closed:
                return False
            if self._calls[threading.get_ident()]:
                raise RuntimeError(
                    "Model.close() was called inside a call of this Model (from its progress handler?): it would "
                    "wait for that call to end, which waits for it; return False from the handler to cancel the "
                    "call, and close the model after it returns")
            self.closed = True
            self._changed.wait_for(lambda: not self._calls)
            return True
