"""A guard in front of uvicorn's HTTP protocol: every request's head (its request line and
headers) bounded in size and in time, the connections open at once bounded in number, and the
connections still open when the drain time runs out closed.

uvicorn's httptools protocol reads a head of any size (a 96 MB header was read, for 11.7 s of
the event loop, and answered 200), and its one limit on heads, ``h11_max_incomplete_event_size``,
is the h11 protocol's and answers 400. So ``uform serve`` runs, as uvicorn's ``http``
protocol (``uvicorn.Config(http=...)`` takes an ``asyncio.Protocol`` class), a protocol of its
own, :class:`Guard`, that hands every byte on to the protocol uvicorn runs for
``http="httptools"`` through ``asyncio.Protocol``'s methods alone, after reading it with an
httptools parser of its own told only where messages begin and end and the URL's bytes (with
no header callback, httptools keeps no header in Python: the parse is llhttp's C).

A URL over ``max_url_bytes`` is answered 414, a head over ``max_header_bytes`` 431, each in
OpenAI's error shape with ``Connection: close``, counted and logged as the application counts
and logs what it answers (``refused``: ``App.refused``, by the route its path names where
the path was read whole, else ``other``), and the connection is closed (after dropping
up to 1 MiB more for up to 2 s, so that the client reads the answer rather than a reset):
none of that head reaches uvicorn past the read that crossed the limit, and nothing is parsed
after it, so a refusal costs O(limit). A head
is measured from its first byte when it starts a read (a new connection, a client that waits
for its answer); a head that starts in the middle of a read, after a pipelined request, is
measured from the next read, so it may run one read (at most 256 KiB) over before it is
refused. A chunked body whose chunks declare more than ``max_body_bytes`` is answered 413 when
the chunk size saying so arrives (:mod:`uform.serve.chunks`), before that chunk's bytes are read,
and one sent in more than ``chunks.MAX_CHUNKS`` chunks when the chunk too many begins.
Malformed HTTP (a ``Content-Length`` of ``-5``, a bad request line, header or chunk
size: what llhttp refuses) is answered 400 ``invalid_http`` the same way, naming llhttp's
reason, before uvicorn's parser (which reads with the same leniency) would answer it in plain
text.

The connections' count and clocks are :mod:`uform.serve.connections`.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from typing import Any, cast

import httptools  # the guard's parser; uform serve refuses to start without it (no fallback to uvicorn's h11 protocol)

from .asgi import too_large
from .chunks import ChunkedBodies
from .connections import CURRENT
from .connections import TICK as TICK
from .connections import Connections as Connections
from .connections import Refusals as Refusals
from .errors import ApiError

END_OF_HEAD = b"\r\n\r\n"
LINGER_BYTES = 1 << 20  # read and dropped after a refusal before the connection is closed
LINGER_SECONDS = 2.0
REASONS = {400: b"Bad Request", 408: b"Request Timeout", 413: b"Request Entity Too Large", 414: b"URI Too Long", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


class Refused(Exception):
    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def answer(refusal: Refused) -> bytes:
    """The whole HTTP answer to ``refusal``: OpenAI's error shape, ``Connection: close`` (and
    ``Retry-After: 1`` to a 503)."""
    body = ApiError(refusal.status, refusal.message, code=refusal.code).encoded()
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n%s\r\n"
    retry = b"retry-after: 1\r\n" if refusal.status == 503 else b""
    return head % (refusal.status, REASONS[refusal.status], len(body), retry) + body


def guarded(inner: type[asyncio.Protocol], max_url_bytes: int, max_header_bytes: int, connections: Connections,
            refused: Refusals | None = None, max_body_bytes: int | None = None) -> type[Guard]:  # fmt: skip
    """The protocol class to give uvicorn: :class:`Guard` in front of ``inner`` with these
    limits; ``refused`` counts and logs each refusal (the application's ``App.refused``);
    ``max_body_bytes``: a chunked body declaring more is refused 413 (None: not read)."""
    return type("Guard", (Guard,), {"inner_class": inner, "max_url_bytes": max_url_bytes, "max_header_bytes": max_header_bytes,
                                    "connections": connections, "refused_with": staticmethod(refused) if refused else None,
                                    "max_body_bytes": max_body_bytes})  # fmt: skip


class Guard(ChunkedBodies, asyncio.Protocol):
    """One connection: bytes checked, then handed to ``inner_class``'s protocol (made with the
    arguments uvicorn gives this class)."""

    inner_class: type[asyncio.Protocol]
    max_url_bytes: int
    max_header_bytes: int
    connections: Connections
    refused_with: Refusals | None = None
    max_body_bytes: int | None = None

    def __init__(self, **kwargs: Any) -> None:
        self.inner = self.inner_class(**kwargs)
        self.parser: Any = httptools.HttpRequestParser(self)
        try:  # as uvicorn's own parser reads (a pipelined request after one that closes): the two read the same bytes alike
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        except AttributeError:  # httptools < 0.6.3
            pass
        self.upgrade: type[Exception] = httptools.HttpParserUpgrade
        self.transport: asyncio.Transport | None = None
        self.in_message = self.in_head = False
        self.head = self.url = 0  # bytes of the head being read, of its URL
        self.target = b""  # the URL's bytes read so far (at most a read past max_url_bytes)
        self.began = 0.0  # when the message being read began
        self.begun = self.heads_ended = 0  # in the read being parsed
        self.tail = b""  # the last bytes of the previous read: an end of head may straddle two
        self.refused = False
        self.linger = 0  # bytes still to drop after a refusal
        self.waiting = 0.0  # since when a head is awaited (perf_counter), 0 while none is
        self.began_message = 0.0  # when the message still arriving began, 0 while none is
        self.stalled = 0.0  # since when the transport has paused writing (the client not reading), 0 while it writes
        self.turned_away = False  # over Connections.limit: never handed to the inner protocol
        self.lost = False  # connection_lost came

    # -- httptools' callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.chunks = 0
        self.in_message = self.in_head = True
        self.url = 0
        self.begun += 1
        self.began = self.began_message = time.perf_counter()
        if not self.waiting:  # a connection's first head is timed from its start
            self.waiting = self.began

    def on_url(self, url: bytes) -> None:
        self.target = self.target + url if self.url else url
        self.url += len(url)
        if self.url > self.max_url_bytes:
            raise Refused(414, f"the URL is over the limit of {self.max_url_bytes} bytes (--max-url-bytes)", "url_too_long")

    def on_chunk_header(self) -> None:
        super().on_chunk_header()
        if (why := self.chunks_over()) is not None:  # a body sent in too many chunks: refused before uvicorn parses this read
            raise Refused(413, why, "too_many_chunks")

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.heads_ended += 1
        self.waiting = 0.0

    def on_message_complete(self) -> None:
        self.in_message = False
        self.began_message = 0.0
        if self.body_bytes or self.line_start:  # the next message's body is counted afresh
            self.body_bytes = 0
            if self.line_start or self.header_read:
                self.message_done()

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one without deriving from it
        self.began = self.waiting = time.perf_counter()
        connections = self.connections
        if len(connections.open) >= connections.limit:
            self.turned_away = True
            self.refuse(Refused(503, f"the server has {connections.limit} connections open, its limit (--max-connections); retry shortly",
                                "too_many_connections"))  # fmt: skip
            return
        connections.open.add(self)
        connections.watch()
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.connections.open.discard(self)
        if not self.turned_away:
            self.inner.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return None if self.turned_away else self.inner.eof_received()

    def pause_writing(self) -> None:
        self.stalled = time.perf_counter()
        if not self.turned_away:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.stalled = 0.0
        if not self.turned_away:
            self.inner.resume_writing()

    def cut_off(self) -> None:
        """Drop the connection and what it has not sent: a reset (SO_LINGER 0), so that neither
        the transport nor the kernel keeps the bytes the client does not read."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()

    def overdue(self, now: float, later: float) -> None:
        """The head awaited since ``self.waiting`` is late: answered 408 and closed; or the
        message begun before ``later`` still arrives: closed. Unless uvicorn stopped reading
        this connection (its clocks then start again)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            self.waiting = self.began_message = 0.0
        elif not transport.is_reading():
            self.waiting = now if self.waiting else 0.0
            self.began_message = now if self.began_message else 0.0
        elif not self.waiting:  # the head arrived; the body never did, nor was it read
            self.began_message = 0.0
            transport.close()
        else:
            self.refuse(Refused(408, f"the request's head did not arrive whole within {self.connections.head_seconds:g} s (--header-timeout)",
                                "header_timeout"))  # fmt: skip

    def data_received(self, data: bytes) -> None:
        if self.refused:
            self.linger -= len(data)
            if self.linger < 0 and self.transport is not None:
                self.transport.close()
            return
        try:
            self.check(data)
        except Refused as refusal:
            self.refuse(refusal)
            return
        token = CURRENT.set(self)  # the task uvicorn starts for a request here knows its connection (App: 499 once it is lost)
        try:
            self.inner.data_received(data)
        finally:
            CURRENT.reset(token)

    def check(self, data: bytes) -> None:
        """Parse ``data``; raise :class:`Refused` for a URL or head over its limit, or for bytes
        that are not HTTP."""
        continuing, between = self.in_head, not self.in_message
        self.begun = self.heads_ended = 0
        try:
            self.parser.feed_data(data)
        except Refused:
            raise
        except self.upgrade:  # an Upgrade header (no websockets here): uvicorn answers the request and reads on, so do we
            pass
        except Exception as exc:  # noqa: BLE001 - malformed: answered here, in the server's error shape, before uvicorn reads it
            if isinstance(exc.__context__, Refused):  # where httptools wraps the callback's exception
                raise exc.__context__ from None
            raise Refused(400, f"the request is not valid HTTP: {exc}", "invalid_http") from None
        first = None  # the size of the first head this read ends or leaves open, where it is known
        if continuing:
            end = (self.tail + data).find(END_OF_HEAD)
            first = self.head + (end + len(END_OF_HEAD) - len(self.tail) if self.heads_ended and end >= 0 else len(data))
        elif between and self.begun:  # a head that starts this read: from its first byte
            end = data.find(END_OF_HEAD)
            first = end + len(END_OF_HEAD) if self.heads_ended and end >= 0 else len(data)
        if first is not None and first > self.max_header_bytes:
            raise Refused(431, f"the request's headers are over the limit of {self.max_header_bytes} bytes (--max-header-bytes)",
                          "headers_too_large")  # fmt: skip
        if self.in_head:  # a head left open: what it holds so far, where known
            opened_here = self.begun > (0 if continuing else 1) or (self.begun and not between)
            self.head = 0 if opened_here else (first or 0)
        elif self.in_message and self.max_body_bytes is not None and self.declared(data) > self.max_body_bytes:  # a body still arriving
            error = too_large(self.max_body_bytes)
            raise Refused(error.status, error.message, error.code or "")
        self.tail = data[-(len(END_OF_HEAD) - 1) :]

    def refuse(self, refusal: Refused) -> None:
        """Answer the refusal and close, reading (and dropping) up to ``LINGER_BYTES`` more for
        up to ``LINGER_SECONDS`` first: closing with unread bytes would reset the connection,
        and the client could lose the answer before it read it."""
        self.refused = True
        self.waiting = self.began_message = 0.0
        transport = self.transport
        if self.refused_with is not None:
            peer = transport.get_extra_info("peername") if transport is not None else None
            handed = self.in_message and not self.in_head and not self.heads_ended  # its head reached uvicorn in an earlier read
            self.refused_with(tuple(peer[:2]) if peer else None, self.method(), self.path(refusal.status), refusal.status, self.began,
                              handed)  # fmt: skip
        if transport is None:
            return
        transport.write(answer(refusal))
        if transport.can_write_eof():
            transport.write_eof()
        self.linger = LINGER_BYTES
        asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.close)

    def method(self) -> str:
        try:
            return cast(bytes, self.parser.get_method()).decode("latin-1")
        except Exception:  # noqa: BLE001 - not read yet
            return "-"

    def path(self, status: int) -> str:
        """The path of the request refused: the URL's before its query, as far as it was read
        (a URL cut short by a 414 names no route)."""
        path, query, _ = self.target.partition(b"?")
        return path.decode("latin-1") + ("" if query or status != 414 else "...")
