"""``Life``: the open-or-closed state a ``Model`` shares with its receivers."""

from __future__ import annotations

import threading


class Life:
    """Whether a model (and every receiver made from it) is open, and how many calls run."""

    def __init__(self, owns_executor: bool) -> None:
        self.owns_executor = owns_executor
        self.closed = False
        self._calls = 0
        self._changed = threading.Condition()

    def enter(self) -> None:
        with self._changed:
            if self.closed:
                raise ValueError("this Model was closed (Model.close() or the end of its with block); load it again to use it")
            self._calls += 1

    def leave(self) -> None:
        with self._changed:
            self._calls -= 1
            self._changed.notify_all()

    def close(self) -> bool:
        """Refuse new calls and wait for those running; False when it was closed already."""
        with self._changed:
            if self.closed:
                return False
            self.closed = True
            self._changed.wait_for(lambda: self._calls == 0)
            return True
