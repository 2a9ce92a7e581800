"""One write a response: uvicorn's httptools protocol with its transport's writes coalesced.

uvicorn writes a response's head at ``http.response.start`` and its body at
``http.response.body``: two ``send`` system calls, two TCP segments, and over loopback the
sender's CPU pays for delivering each (profiled: the larger part of the event loop's time
a small request). :class:`OneWrite` buffers the writes of one turn of the event loop and
writes them together at its end (a handler that sends both messages without waiting in
between, as every route here does, leaves in one segment). Closing writes what is buffered
first; everything else is the transport's own.

:func:`write_whole` answers a request with one write of its own (status line, uvicorn's
default headers, the handler's, the body) instead of uvicorn's two ``send`` messages, which
check every header with two regular expressions and build the head again each time
(profiled: a fifth of the event loop's time a small request). It writes what uvicorn's
``send`` would, sets the request cycle's state as ``send`` does, and declines (False: send as
usual) wherever it is not sure: another server, a response already begun, paused writing,
a connection not kept alive, uvicorn's own access log on, a cycle without an attribute it reads.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

_Cycle: Any = None  # uvicorn's httptools request cycle, the one kind write_whole finishes
STATUS_LINE: dict[int, bytes] = {}
try:
    from uvicorn.protocols.http import httptools_impl as _impl

    _Cycle, STATUS_LINE = _impl.RequestResponseCycle, _impl.STATUS_LINE
except ImportError:  # pragma: no cover - uvicorn or httptools absent: always send as usual
    pass


class OneWrite:
    """A transport whose ``write`` calls of one loop turn become one."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data if isinstance(data, bytes) else bytes(data))

    def write_now(self, data: bytes) -> None:
        """Write ``data`` after what is buffered, in one write, now."""
        if self._pending:
            self._pending.append(data)
            self.flush()
        else:
            self._transport.write(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        if self._pending:
            data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
            self._pending.clear()
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(b) for b in self._pending)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def protocol() -> type[asyncio.Protocol] | None:
    """uvicorn's httptools protocol writing through :class:`OneWrite`; None without httptools."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class OneWriteHttpTools(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(OneWrite(cast(asyncio.Transport, transport)))  # type: ignore[arg-type]

    return OneWriteHttpTools


_defaults: list[Any] = [None, b""]  # uvicorn's default headers (a list it replaces every tick) and their bytes


def write_whole(send: Any, status: int, head: bytes, body: bytes) -> bool:
    """Answer through ``send``'s uvicorn request cycle in one write: the status line, uvicorn's
    default headers (date, server), ``head`` (header lines, each ending in CRLF, with the
    blank line after them) and ``body``; False, having sent nothing, where the cycle is not
    one this knows how to finish (the caller sends the response as usual)."""
    cycle: Any = getattr(send, "__self__", None)
    if _Cycle is None or type(cycle) is not _Cycle:
        return False
    try:  # everything read before anything is changed: a uvicorn without one of these declines
        if cycle.response_started or cycle.disconnected or not cycle.keep_alive or cycle.access_log or cycle.flow.write_paused:
            return False
        defaults, transport = cycle.default_headers, cycle.transport
        finish = cycle.message_event.set, cycle.on_response
    except AttributeError:
        return False
    if defaults is not _defaults[0]:
        _defaults[:] = defaults, b"".join(b"%s: %s\r\n" % pair for pair in defaults)
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    data = b"".join((STATUS_LINE[status], _defaults[1], head, body))
    if type(transport) is OneWrite:
        transport.write_now(data)
    else:
        transport.write(data)
    cycle.response_complete = True
    for step in finish:
        step()
    return True
