"""One write a response: uvicorn's httptools protocol with its transport's writes coalesced.

uvicorn writes a response's head at ``http.response.start`` and its body at
``http.response.body``: two ``send`` system calls, two TCP segments, and over loopback the
sender's CPU pays for delivering each (profiled: the larger part of the event loop's time
a small request). :class:`OneWrite` buffers the writes of one turn of the event loop and
writes them together at its end (a handler that sends both messages without waiting in
between, as every route here does, leaves in one segment). Closing writes what is buffered
first; everything else is the transport's own.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast


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
