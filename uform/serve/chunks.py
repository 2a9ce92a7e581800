"""The size a chunked request body declares, read as it arrives, for the guard
(:mod:`uform.serve.guard`): a body whose chunks declare more than the body limit
(``--max-request-bytes``) is refused 413 as soon as the chunk header saying so arrives, not
once that many bytes of it did.

A chunked body's size is known only chunk by chunk, and the application counts the bytes that
arrived (413 past the limit): a client that declared one chunk of 100 GB and sent a byte of it
a second held its request until ``--body-timeout`` (60 s; a 408), and one that sent it fast had
32 MiB held before its 413. llhttp parses the chunk sizes but httptools tells no one what they
are, so the guard's own parser is told where chunks begin and end and how many of their bytes
arrived (``on_chunk_header``, ``on_body``, ``on_chunk_complete``: three C-to-Python calls a
chunk), and at the end of each read the chunk still open, if its header came in that read, has
its size line read back from the read's bytes: it ends where that chunk's bytes in the read
begin. Only the open chunk can declare more than has arrived, so the body declares the bytes
of its chunks so far plus what the open chunk still awaits.

A chunk costs the event loop about 1.2 us (the guard's three calls, uvicorn's own parser's),
whatever its size: 34 MB sent in chunks of one byte took 40 s of the loop to reach the 413
(every /health answered in up to 357 ms meanwhile), in 64 KiB chunks 0.17 s. So a body is
refused 413 past ``MAX_CHUNKS`` chunks (:meth:`ChunkedBodies.chunks_over`): at most about
80 ms of the loop a body, as a 32 MiB one in large chunks costs.
"""

from __future__ import annotations

MAX_SIZE_LINE = 1024  # a chunk's size line (with its extensions) longer than this is not read here (llhttp reads it)
MAX_CHUNKS = 1 << 16  # chunks of one body; more is refused 413 (a 32 MiB body in chunks of 512 bytes or more is under it)


class ChunkedBodies:
    """The callbacks and state a guard needs for :meth:`declared`: one message at a time."""

    body_bytes = 0  # the bytes of the message's body arrived so far
    open_read = 0  # of which those of the open chunk in the current read
    chunk_open = False  # a chunk's header read, its bytes and CRLF not all
    header_read = False  # a chunk header read in the current read
    line_start = b""  # the bytes of the current read's last line not ended, where it may be a size line
    chunks = 0  # the message's chunk headers read so far

    def on_chunk_header(self) -> None:
        self.chunk_open = self.header_read = True
        self.open_read = 0
        self.chunks += 1

    def chunks_over(self) -> str | None:
        """Why the message's body is refused for its chunks' count, None while it is not."""
        if self.chunks <= MAX_CHUNKS:
            return None
        return (f"the request body is sent in over {MAX_CHUNKS} chunks, the limit of uform.serve.chunks.MAX_CHUNKS "
                "(each costs the server alike whatever its size): send it in fewer, larger chunks, or with a Content-Length")  # fmt: skip

    def on_body(self, body: bytes) -> None:
        size = len(body)
        self.body_bytes += size
        self.open_read += size

    def on_chunk_complete(self) -> None:
        self.chunk_open = False

    def declared(self, data: bytes) -> int:
        """After ``data`` was parsed, a chunked body still arriving: the bytes it declares so far
        (0 where the open chunk's header did not come in ``data``, or its line cannot be read:
        the bytes arrived, which the application counts, are the bound then)."""
        header_read, self.header_read = self.header_read, False
        if not self.chunk_open:  # a size line may be arriving: keep what the read holds of it
            cut = data.rfind(b"\n", max(0, len(data) - MAX_SIZE_LINE))
            if cut >= 0:
                self.line_start = data[cut + 1 :]
            else:
                self.line_start = self.line_start + data if len(self.line_start) + len(data) <= MAX_SIZE_LINE else b""
            return 0
        if not header_read:
            return 0
        end = len(data) - self.open_read  # just past the size line's LF
        start = data.rfind(b"\n", max(0, end - 1 - MAX_SIZE_LINE), end - 1) + 1
        if not start and end > MAX_SIZE_LINE:  # a line too long to read here
            return 0
        line = data[start:end] if start else self.line_start + data[:end]
        self.line_start = b""
        try:
            size = int(line.split(b";", 1)[0].strip(b" \t\r\n"), 16)
        except ValueError:
            return 0
        return self.body_bytes - self.open_read + size

    def message_done(self) -> None:
        """The message ended: the next one's body starts afresh."""
        self.body_bytes = self.open_read = self.chunks = 0
        self.chunk_open = self.header_read = False
        self.line_start = b""
