"""The connections ``uform serve``'s guard (:mod:`uform.serve.guard`) keeps: how many are open,
and the time each head, body and unread answer is given.

uvicorn closes a connection kept alive after an answer once it has been idle
``timeout_keep_alive`` seconds, but never one that has not sent a whole head: a client that
connects and sends nothing, or part of a head, held its connection (and the head so far) for
good, and any number of them were held (2,000 such connections: +55 MB, none ever closed;
uvicorn's ``limit_concurrency`` only answers 503 to heads that arrived whole). So
:class:`Connections` counts the guarded connections: one past ``limit`` is answered 503 at
once and closed, and a head still incomplete ``head_seconds`` after the connection was made
(its first request) or after its first byte (later ones) is answered 408 and closed. A message
whose body is still arriving ``head_seconds + body_seconds`` after its head began is closed
without an answer: the application reads a body within ``body_seconds`` (408 beyond), so this
ends only a body it does not read (a request answered without it, a 405, a GET), which a
client sending a byte now and then held for good (each byte restarts uvicorn's keep-alive
time; one of 30 MB declared, a byte every 2 s, was still open after 30 s). A connection whose
client has not read what was written to it for ``send_seconds`` (the transport paused writing,
and has not resumed since) is reset, its unsent bytes dropped: four pipelined requests of
2,048 texts never read held the answers past what the sockets buffer for good. One timer
keeps that time for every connection (``TICK``: a head gets ``head_seconds`` and at most
``TICK`` more); a connection uvicorn stopped reading (a pipelined request waiting for the one
before it) has its clock started again, as that wait is the server's, not the client's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

TICK = 0.5  # seconds between two looks at the heads still arriving


class Watched(Protocol):
    """What :class:`Connections` reads and calls of a connection it keeps (``Guard``)."""

    transport: asyncio.Transport | None
    waiting: float  # since when a head is awaited (perf_counter), 0 while none is
    began_message: float  # when the message still arriving began, 0 while none is
    stalled: float  # since when the transport has paused writing, 0 while it writes
    lost: bool  # the connection is gone (its client closed or reset it, or the server closed it)

    def overdue(self, now: float, later: float) -> None: ...

    def cut_off(self) -> None: ...


@dataclass
class Connections:
    """The guarded connections open now, at most ``limit`` (one more is answered 503), each
    head given ``head_seconds`` to arrive whole (408 beyond); :meth:`close_all` ends them (the
    drain's deadline)."""

    limit: int = 1024
    head_seconds: float = 10.0
    body_seconds: float = 60.0
    send_seconds: float = 60.0
    open: set[Watched] = field(default_factory=set)
    timer: asyncio.TimerHandle | None = None

    def watch(self) -> None:
        """Keep the heads' time while any connection is open."""
        if self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(TICK, self.sweep)

    def sweep(self) -> None:
        now = time.perf_counter()
        late, later = now - self.head_seconds, now - self.head_seconds - self.body_seconds
        for guard in [g for g in self.open if 0 < g.waiting <= late or 0 < g.began_message <= later]:
            guard.overdue(now, later)
        unread = now - self.send_seconds
        for guard in [g for g in self.open if 0 < g.stalled <= unread]:
            guard.cut_off()
        self.timer = asyncio.get_running_loop().call_later(TICK, self.sweep) if self.open else None

    def close_all(self) -> int:
        """Close every connection still open (each had a request in flight: uvicorn closes idle
        ones when it starts to drain); its client sees the connection close. Answers how many."""
        guards = list(self.open)
        for guard in guards:
            if guard.transport is not None:
                guard.transport.close()
        return len(guards)


# The guarded connection whose bytes made the request being served: the guard sets it while it
# hands bytes to uvicorn, so the task uvicorn starts for a request copies it (a pipelined
# request's task is started from the one before it, on the same connection). None under an
# ASGI server without the guard.
CURRENT: ContextVar[Watched | None] = ContextVar("uform_serve_connection", default=None)


def left() -> bool:
    """Whether the connection of the request being served is gone: an answer written now
    reaches no one (uvicorn drops it without a word), so it is no answer (499)."""
    connection = CURRENT.get()
    return connection is not None and connection.lost


# (client, method, path, status, began, handed: the application holds the request, its head handed on): App.refused
Refusals = Callable[[Any, str, str, int, float, bool], None]
