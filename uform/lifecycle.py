"""``Life``: the open-or-closed state a ``Model`` shares with its receivers, across ``os.fork`` too."""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from collections import Counter


class Life:
    """Whether a model (and every receiver made from it) is open, and which threads run calls.

    ``held`` is what the load placed (its runtime: ONNX Runtime sessions and their threads). A
    child of ``os.fork`` has none of those threads, and freeing such sessions there hung or
    crashed the child (a segfault as it exited), so a child keeps its copy for good: see
    :func:`_in_a_forked_child` and ``forked``.
    """

    def __init__(self, owns_executor: bool, held: object = None) -> None:
        self.owns_executor = owns_executor
        self.held = held
        self.pid = os.getpid()  # the process that loaded the model
        self.closed = False
        self._calls: Counter[int] = Counter()  # thread id -> calls it is running
        self._changed = threading.Condition()
        _LIVES.add(self)

    @property
    def forked(self) -> bool:
        """Whether this process is a child of ``os.fork`` of the one that loaded the model."""
        return self.pid != os.getpid()

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


_LIVES: weakref.WeakSet[Life] = weakref.WeakSet()


def _in_a_forked_child() -> None:
    """After ``os.fork``, in the child: the calls other threads were running are not there (a
    close would wait for them forever, and the lock may have been held), and what each load
    placed is kept for good (one more reference, never dropped: CPython's ``Py_IncRef``)."""
    for life in list(_LIVES):
        life._calls, life._changed = Counter(), threading.Condition()
        if life.held is not None:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(life.held))


os.register_at_fork(after_in_child=_in_a_forked_child)
