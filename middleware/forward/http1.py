"""The relay's HTTP/1.1 client: pooled keep-alive connections, responses parsed by httptools.

The relay sends one POST per miss to a replica it knows and reads the answer back, streamed or
whole; it needs no cookies, redirects, proxies, compression or multipart. aiohttp's client does
all of that on every request, and on a proxy that relays every miss that per-request work is a
large part of its CPU. The response parser is
httptools (llhttp, the parser uvicorn serves with); this module keeps connections and frames
requests.

Semantics the relay relies on: `send` raises `ConnectionError` (refused, reset, closed early,
a response that is not HTTP), `asyncio.TimeoutError` (connect, or no bytes for `timeout` s while
a response is awaited or read) or `ValueError` (a header that would break the request's
framing); a pooled connection the server had closed is retried once on a new one, as long as
no byte of a response came back. A response read to its end goes back to the pool; `close()`
on one that was not drops its connection. A reader slower than the replica pauses the socket
(at most `HIGH_WATER` bytes buffered).
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 1 << 20  # bytes of a response buffered before the socket is paused
LOW_WATER = 1 << 18  # resumed once the reader has taken it below this
Target = tuple[str, str, int, str]  # scheme, host, port, path (with query)
# uvloop's clock ticks in milliseconds: a deadline less than a tick away counts as reached, so a
# firing timer never re-arms itself for a fraction of a tick (it would fire again at once)
CLOCK_TICK_S = 0.001


def target_of(url: str) -> Target:
    """(scheme, host, port, path) of an http(s) URL; ValueError for anything else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port, path


# what would end a header line or the head (CR, LF, NUL), and in a name, split it (':')
_BREAKS_NAME = re.compile("[\r\n\0:]")
_BREAKS_VALUE = re.compile("[\r\n\0]")


class ConnectFailed(ConnectionError):
    """No connection could be opened (refused, unreachable): nothing listens there."""


def request_head(target: Target, body_len: int, headers: dict[str, str], method: str = "POST") -> bytes:
    """The request line and headers of a `method` request with a body of `body_len` bytes (a
    GET without a body says no length).

    Invariant: the result is one well-framed HTTP/1.1 head (ValueError for a header name or
    value holding CR, LF or NUL, or a name holding ':', which would end or split it)."""
    return with_length(head_parts(target, headers, method), body_len, method)


def head_parts(target: Target, headers: dict[str, str], method: str = "POST") -> tuple[bytes, bytes]:
    """A head without its length: (the request and host lines, the headers after them); checked
    as `request_head` checks them. The same for every request to a replica with the same headers."""
    _, host, port, path = target
    default = 443 if target[0] == "https" else 80
    authority = host if port == default else f"{host}:{port}"
    if ":" in host and not host.startswith("["):  # an IPv6 literal
        authority = f"[{host}]" if port == default else f"[{host}]:{port}"
    # one scan of all names and one of all values, at C speed: a request sends a few headers each time
    if _BREAKS_NAME.search("".join(headers)) or _BREAKS_VALUE.search("".join(headers.values())):
        name = next(n for n, v in headers.items() if _BREAKS_NAME.search(n) or _BREAKS_VALUE.search(v))
        raise ValueError(f"header {name!r} holds a character that would break the request")
    start = f"{method} {path} HTTP/1.1\r\nhost: {authority}"
    rest = "".join([f"\r\n{name}: {value}" for name, value in headers.items()]) + "\r\n\r\n"
    return start.encode("latin-1"), rest.encode("latin-1")


def with_length(parts: tuple[bytes, bytes], body_len: int, method: str) -> bytes:
    """`head_parts`' head with the body's length between its two parts (none for a GET without a body)."""
    if body_len or method != "GET":
        return b"%s\r\ncontent-length: %d%s" % (parts[0], body_len, parts[1])
    return parts[0] + parts[1]


class Connection(asyncio.Protocol):
    """One keep-alive connection; carries one response at a time."""

    def __init__(self, keep: frozenset[bytes] = frozenset()) -> None:
        self.transport: asyncio.Transport | None = None
        self.keep = keep  # response headers (lower-case names) a caller reads back (Response.headers)
        self.kept: dict[str, str] = {}
        self.closed = False
        self.idle_since = time.monotonic()
        self._body: deque[bytes] = deque()
        # the parser calls on_body once per chunk of a streamed answer: the deque's own append takes
        # them, with no Python frame; bound before the parser is made, which looks its callbacks up once
        self.on_body = self._body.append
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        # One deadline timer per connection, moved only when it fires (see `wait`): arming and
        # cancelling a timer for every wait would cost more than the read it guards.
        self._due = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        if self.keep:
            self.kept = {}
        self.keep_alive = False
        self.headers_done = False
        self.complete = False
        self.got_bytes = False
        self.error: BaseException | None = None
        self._framed = False  # content-length or chunked: its end is in the stream, not at EOF
        self._body.clear()
        self._buffered = 0
        self._paused = False

    # ------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self._parser.feed_data(data)
            # counted as read (heads and chunk framing too): at most what the body holds, plus its framing
            self._buffered += len(data)
            if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()
            self._wake()  # once per read, whatever the parser's callbacks found in it
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"replica sent a response that is not HTTP/1.1: {exc}"))
            self.close()
        except httptools.HttpParserUpgrade:  # never asked for: not a response we can read
            self._fail(ConnectionError("replica switched protocols"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and not self.complete and not self._framed and self.error is None:
            self.complete = True  # a body that ends with the connection (no length, not chunked)
            self._wake()
        elif not self.complete:
            self._fail(ConnectionError(f"replica closed the connection{f' ({exc})' if exc else ''}"))

    # ------------------------------------------------------------ httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower in (b"content-length", b"transfer-encoding"):
            self._framed = True
        if lower in self.keep:
            self.kept[lower.decode("latin-1")] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        self.headers_done = True

    def on_message_complete(self) -> None:
        self.complete = True

    # ------------------------------------------------------------ the response's reader
    async def wait(self, timeout: float) -> None:
        """Until something happens (head, body bytes, end, error); TimeoutError after `timeout` s.

        Invariant: a wait that sees nothing for `timeout` s fails, and one that sees something
        first never does. The connection's one timer is armed for the earliest deadline of a wait
        in progress or past; when it fires it fails the wait in progress if that one is due, and
        otherwise moves itself to that wait's deadline (or stops, with no wait in progress)."""
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        self._due = due = loop.time() + timeout
        timer = self._timer
        if timer is None or timer.when() > due:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(due, self._deadline)
        try:
            await waiter
        finally:
            self._waiter = None

    def take(self) -> bytes:
        """The body bytes buffered so far (resuming a paused socket once drained)."""
        data = b"".join(self._body) if len(self._body) != 1 else self._body[0]
        self._body.clear()
        self._buffered = 0
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()
        return data

    def has_body(self) -> bool:
        return bool(self._body)

    def begin(self, head_and_body: bytes) -> None:
        """Send a request; ConnectionError at once when the replica already closed the connection
        (it accepted, then dropped it before a byte was written), which no read would report."""
        assert self.transport is not None
        if self.closed:
            raise self.error or ConnectionError("replica closed the connection")
        self._reset()
        self.transport.write(head_and_body)

    def close(self) -> None:
        self.closed = True
        self._stop_timer()
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _deadline(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # no wait in progress: the next one arms the timer again
        loop = waiter.get_loop()
        if loop.time() + CLOCK_TICK_S >= self._due:
            waiter.set_exception(asyncio.TimeoutError())
        else:  # this wait started after the timer was armed: its own deadline
            self._timer = loop.call_at(self._due, self._deadline)

    def _stop_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()


class Response:
    """A replica's response: its status at once, its body read whole or as it comes."""

    def __init__(self, conn: Connection, pool: Pool, key: tuple[str, str, int], timeout: float) -> None:
        self._conn: Connection | None = conn
        self._pool, self._key, self._timeout = pool, key, timeout
        self.status = conn.status
        self.headers = dict(conn.kept)  # the pool's `keep_headers` this response carried

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (whatever is buffered at each step)."""
        while self._conn is not None:
            conn = self._conn
            if conn.has_body():
                yield conn.take()
            elif conn.error is not None:
                raise conn.error
            elif conn.complete:
                self.close()  # read to its end: back to the pool
                return
            else:
                await conn.wait(self._timeout)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.complete and conn.keep_alive and not conn.closed and conn.error is None:
            self._pool.give_back(self._key, conn)
        else:
            conn.close()


class Pool:
    """Keep-alive connections per (scheme, host, port); idle ones older than `keepalive_s` are
    dropped (before the server drops them)."""

    def __init__(self, keepalive_s: float, keep_headers: frozenset[str] = frozenset()) -> None:
        """`keep_headers`: response headers (lower-case names) to hand back on `Response.headers`;
        none by default (the relay reads none, and parses no header it does not need)."""
        self.keepalive_s = keepalive_s
        self._keep = frozenset(h.encode("latin-1") for h in keep_headers)
        self._idle: dict[tuple[str, str, int], list[Connection]] = {}
        self._targets: dict[str, Target] = {}
        self._heads: dict[tuple[Any, ...], tuple[bytes, bytes]] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> Response:
        """POST `body`; the response once its head is in. See the module's docstring for errors."""
        return await self.send("POST", url, body, headers, timeout)

    async def send(self, method: str, url: str, body: bytes, headers: dict[str, str], timeout: float) -> Response:
        """A `method` request; the response once its head is in."""
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = target_of(url)
            if len(self._targets) > 1024:  # replicas come from the config: this never grows for long
                self._targets.pop(next(iter(self._targets)))
        key = target[:3]
        # a replica gets the same headers on every request: their checked head is made once
        head_key = (url, method, *headers.items())
        parts = self._heads.get(head_key)
        if parts is None:
            parts = self._heads[head_key] = head_parts(target, headers, method)
            if len(self._heads) > 1024:  # a caller's own extra headers may vary: the oldest go
                self._heads.pop(next(iter(self._heads)))
        message = with_length(parts, len(body), method) + body
        conn = self._idle_connection(key)
        if conn is not None:
            try:
                return await self._exchange(conn, key, message, timeout)
            except ConnectionError:
                if conn.got_bytes:  # the replica answered something: not a stale connection
                    raise
        return await self._exchange(await self._connect(key, timeout), key, message, timeout)

    def give_back(self, key: tuple[str, str, int], conn: Connection) -> None:
        conn.idle_since = time.monotonic()
        self._idle.setdefault(key, []).append(conn)

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

    async def _exchange(self, conn: Connection, key: tuple[str, str, int], message: bytes, timeout: float) -> Response:
        try:
            conn.begin(message)
            while not conn.headers_done:
                if conn.error is not None:
                    raise conn.error
                await conn.wait(timeout)
        except BaseException:
            conn.close()
            raise
        return Response(conn, self, key, timeout)

    def _idle_connection(self, key: tuple[str, str, int]) -> Connection | None:
        conns = self._idle.get(key)
        now = time.monotonic()
        while conns:
            conn = conns.pop()  # the most recently used: the likeliest to be alive
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
        return None

    async def _connect(self, key: tuple[str, str, int], timeout: float) -> Connection:
        scheme, host, port = key
        tls = None
        if scheme == "https":
            tls = self._tls = self._tls or ssl.create_default_context()
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: Connection(self._keep), host, port, ssl=tls), timeout
            )
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {host}:{port}: {exc}") from exc
        return conn
