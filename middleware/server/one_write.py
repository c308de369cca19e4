"""A response's head goes out in the same socket write as its first body bytes.

uvicorn writes a response's status line and headers the moment the app sends
`http.response.start`, then each body part as the app sends it: a one-part body costs two writes,
so two system calls, and a client may read the head alone and wake twice. `OneWriteHttp` is
uvicorn's httptools protocol over a transport that holds a write starting with a status line
until the next write (the body, usually in the same step of the same task) or the end of the
event loop's current turn, whichever comes first, and then sends both as one.

Invariants: the bytes on the wire, and their order, are exactly what uvicorn wrote; nothing is
held past the loop turn in which it was written, and closing the connection sends what is held
first. Only a head is ever held, so streamed body parts go out as they come.

May import: the standard library and uvicorn.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

STATUS_LINE = b"HTTP/1."  # how every response head uvicorn writes begins


class HeadHeldTransport:
    """A transport that holds a response head (a write starting with a status line) until the
    next write or the end of the loop turn; everything else is the wrapped transport's."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + bytes(data))
        elif data[: len(STATUS_LINE)] == STATUS_LINE:
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Send what is held (nothing when nothing is, or when the connection is closing)."""
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def writelines(self, parts: Any) -> None:
        self.write(b"".join(parts))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:  # reading, flow control, extra info: the socket's own
        return getattr(self._transport, name)


class OneWriteHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol whose responses' heads go out with their first body bytes."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(HeadHeldTransport(transport, asyncio.get_running_loop()))  # type: ignore[arg-type]
