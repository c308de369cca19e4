"""The relay's HTTP/1.1 client (kvgate.middleware.forward.http1) against real sockets on 127.0.0.1: servers that
answer in each framing, close idle connections, break mid-body, send garbage or nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvgate.middleware.forward.http1 import HIGH_WATER, Connection, Pool, request_head, target_of

Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """One request's head and body (None at EOF)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    return head, await reader.readexactly(length)


class Server:
    """A scripted HTTP server: `behaviour(reader, writer, n)` answers the n-th request of the
    connection (0-based) and says whether to keep the connection."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.connections = 0
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        n = 0
        try:
            while (request := await read_request(reader)) is not None:
                self.heads.append(request[0])
                self.bodies.append(request[1])
                if not await self.behaviour(reader, writer, n):
                    break
                n += 1
        finally:
            writer.close()


def sends(*steps: bytes | float, keep: bool = True) -> Behaviour:
    """Answers every request with `steps` as is: bytes are written (and drained), a number is a
    pause in seconds between them; `keep`: the connection stays open after it."""

    async def answer(reader, writer, n):
        for step in steps:
            if isinstance(step, bytes):
                writer.write(step)
                await writer.drain()
            else:
                await asyncio.sleep(step)
        return keep

    return answer


def fixed(body: bytes, status: int = 200) -> Behaviour:
    return sends(
        b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body)
    )


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro_fn())


def test_targets_and_heads_are_well_framed():
    assert target_of("http://127.0.0.1:8000/v1/chat/completions?x=1") == (
        "http",
        "127.0.0.1",
        8000,
        "/v1/chat/completions?x=1",
    )
    assert target_of("https://api.example/v1") == ("https", "api.example", 443, "/v1")
    with pytest.raises(ValueError):
        target_of("ftp://host/x")
    head = request_head(("http", "::1", 8000, "/v1"), 5, {"content-type": "application/json"})
    assert (
        head == b"POST /v1 HTTP/1.1\r\nhost: [::1]:8000\r\ncontent-length: 5\r\ncontent-type: application/json\r\n\r\n"
    )
    for bad in ({"x-a": "1\r\nx-injected: 2"}, {"x\nb": "1"}, {"x:b": "1"}, {"x-a": "\0"}):
        with pytest.raises(ValueError):
            request_head(("http", "h", 80, "/"), 0, bad)


_CHARS = st.sampled_from(["a", "x", "-", " ", ":", "\r", "\n", "\0", "é"])


@given(st.dictionaries(st.text(_CHARS, min_size=1, max_size=4), st.text(_CHARS, max_size=4), max_size=4))
def test_a_head_is_refused_exactly_when_a_header_would_break_it(headers):
    breaks = any(set(n) & set("\r\n\0:") or set(v) & set("\r\n\0") for n, v in headers.items())
    if breaks:
        with pytest.raises(ValueError, match="header"):
            request_head(("http", "h", 80, "/"), 0, headers)
        return
    head = request_head(("http", "h", 80, "/"), 3, headers).decode("latin-1")
    assert head.endswith("\r\n\r\n") and head.count("\r\n\r\n") == 1
    lines = head[: -len("\r\n\r\n")].split("\r\n")
    assert lines[:3] == ["POST / HTTP/1.1", "host: h", "content-length: 3"]
    assert lines[3:] == [f"{n}: {v}" for n, v in headers.items()]


def test_a_kept_alive_connection_carries_the_next_requests():
    async def main() -> None:
        server = Server(fixed(b'{"ok": true}'))
        async with server as url:
            pool = Pool(keepalive_s=30)
            for i in range(3):
                response = await pool.post(url, b'{"i": %d}' % i, {"content-type": "application/json"}, 5)
                assert response.status == 200 and await response.read() == b'{"ok": true}'
            assert server.connections == 1 and server.bodies == [b'{"i": 0}', b'{"i": 1}', b'{"i": 2}']
            await pool.aclose()

    run(main)


def test_the_pools_heads_are_request_head_whatever_the_headers_and_bodies():
    async def main() -> None:
        server = Server(fixed(b"{}"))
        async with server as url:
            pool = Pool(keepalive_s=30)
            sent = [
                ({"content-type": "application/json"}, b"{}"),
                ({"content-type": "application/json"}, b'{"a": 12345}'),
                ({"content-type": "application/json", "x-trace": "1"}, b"{}"),
                ({"x-trace": "1", "content-type": "application/json"}, b""),
                ({"content-type": "application/json"}, b"{}"),
            ]
            for headers, body in sent:
                response = await pool.post(url, body, headers, 5)
                await response.read()
            target = target_of(url)
            assert server.heads == [request_head(target, len(body), headers) for headers, body in sent]
            with pytest.raises(ValueError, match="header"):  # a memo of good heads lets no bad one through
                await pool.post(url, b"{}", {"content-type": "application/json\r\nx: 1"}, 5)
            await pool.aclose()

    run(main)


def test_chunked_bodies_come_decoded_and_in_order():
    steps: list[bytes | float] = [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"]
    for piece in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
        steps += [b"%x\r\n%s\r\n" % (len(piece), piece), 0.01]
    chunked = sends(*steps, b"0\r\n\r\n")

    async def main() -> None:
        server = Server(chunked)
        async with server as url:
            pool = Pool(keepalive_s=30)
            pieces = [p async for p in (await pool.post(url, b"{}", {}, 5)).chunks()]
            assert b"".join(pieces) == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n" and len(pieces) >= 2  # as they came
            assert await (await pool.post(url, b"{}", {}, 5)).read() == b"".join(pieces)
            assert server.connections == 1  # read to its end: the connection went back to the pool
            await pool.aclose()

    run(main)


@pytest.mark.parametrize(
    "answer, body",
    [
        # a body that ends with the connection: whole, and the connection is not reused
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it", b"all of it"),
        # answers, then drops the connection without saying so: the pooled one is retried on a new one
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", b"ok"),
    ],
)
def test_a_connection_the_server_closes_after_answering_is_not_used_again(answer, body):
    async def main() -> None:
        server = Server(sends(answer, keep=False))
        async with server as url:
            pool = Pool(keepalive_s=30)
            assert await (await pool.post(url, b"{}", {}, 5)).read() == body
            await asyncio.sleep(0.05)  # the close may or may not have reached the pool yet
            assert await (await pool.post(url, b"{}", {}, 5)).read() == body
            assert server.connections == 2
            await pool.aclose()

    run(main)


def test_failures_raise_what_the_relay_fails_over_on():
    release = asyncio.Event()

    async def silent(reader, writer, n):
        await release.wait()  # neither answers nor closes until the test is done with it
        return False

    async def main() -> None:
        pool = Pool(keepalive_s=30)
        async with Server(sends(b"SSH-2.0-OpenSSH\r\n\r\n")) as url:
            with pytest.raises(ConnectionError):
                await pool.post(url, b"{}", {}, 5)
        async with Server(silent) as url:
            with pytest.raises(asyncio.TimeoutError):  # only its own timeout can end this wait
                await pool.post(url, b"{}", {}, 0.2)
            release.set()
        async with Server(
            sends(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789", keep=False)
        ) as url:  # 10 of 100
            response = await pool.post(url, b"{}", {}, 5)
            with pytest.raises(ConnectionError):
                await response.read()
            response.close()
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(ConnectionError):  # refused
            await pool.post(f"http://127.0.0.1:{port}/v1", b"{}", {}, 5)
        await pool.aclose()

    run(main)


def test_a_slow_reader_pauses_the_socket_and_gets_every_byte():
    size = 8 * HIGH_WATER

    async def big(reader, writer, n):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()
        return True

    async def main() -> None:
        async with Server(big) as url:
            pool = Pool(keepalive_s=30)
            response = await pool.post(url, b"{}", {}, 5)
            conn = response._conn
            got, paused = 0, False
            async for piece in response.chunks():
                got += len(piece)
                await asyncio.sleep(0.02)  # the replica outruns this reader
                paused = paused or (conn is not None and conn._paused)
            assert got == size and paused
            await pool.aclose()

    run(main)


def test_a_response_left_unread_drops_its_connection():
    slow = sends(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n" + b"x" * 1000, 0.2, b"x" * 99_000)

    async def main() -> None:
        server = Server(slow)
        async with server as url:
            pool = Pool(keepalive_s=30)
            response = await pool.post(url, b"{}", {}, 5)
            response.close()  # a client that walked away mid-stream
            assert await (await pool.post(url, b"{}", {}, 5)).read() == b"x" * 100_000
            assert server.connections == 2
            await pool.aclose()

    run(main)


def test_a_connection_closed_before_the_request_fails_at_once():
    """A replica that accepts and drops a connection before the request is written (a crashing
    server, a balancer with nothing behind it): the request fails at once, for the relay to fail
    over, instead of waiting out its timeout for an answer that cannot come."""

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, conn = await asyncio.get_running_loop().create_connection(Connection, "127.0.0.1", port)
        for _ in range(200):  # until the close has reached this side
            if conn.closed:
                break
            await asyncio.sleep(0.01)
        assert conn.closed
        with pytest.raises(ConnectionError):
            conn.begin(request_head(target_of(f"http://127.0.0.1:{port}/v1"), 2, {}) + b"{}")
        server.close()
        await server.wait_closed()

    run(main)


def _spaced_stream(pieces: int, gap_s: float, then_silent_s: float = 0.0) -> Behaviour:
    """A chunked answer of `pieces` events `gap_s` apart; then, with `then_silent_s`, silence that
    long before the end (a replica that stalls mid-stream)."""
    steps: list[bytes | float] = [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"]
    for i in range(pieces):
        piece = b"data: %d\n\n" % i
        steps += [b"%x\r\n%s\r\n" % (len(piece), piece), gap_s]
    return sends(*steps, then_silent_s, b"0\r\n\r\n")


def test_a_stream_slower_in_total_than_its_timeout_is_read_whole():
    # each wait is bounded, not the stream: 8 events 0.06 s apart under a 0.25 s timeout
    async def main() -> None:
        async with Server(_spaced_stream(8, 0.06)) as url:
            pool = Pool(keepalive_s=30)
            body = await (await pool.post(url, b"{}", {}, 0.25)).read()
            assert body == b"".join(b"data: %d\n\n" % i for i in range(8))
            await pool.aclose()

    run(main)


def test_a_stream_that_stalls_times_out_after_what_it_sent():
    async def main() -> None:
        async with Server(_spaced_stream(3, 0.01, then_silent_s=5.0)) as url:
            pool = Pool(keepalive_s=30)
            response = await pool.post(url, b"{}", {}, 0.3)
            got = []
            with pytest.raises(asyncio.TimeoutError):
                async for piece in response.chunks():
                    got.append(piece)
            assert b"".join(got) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
            response.close()
            await pool.aclose()

    run(lambda: asyncio.wait_for(main(), 4.0))


def test_a_shorter_timeout_on_a_kept_connection_is_its_own():
    # the first exchange leaves the connection's timer far out (600 s); the next, which stalls,
    # must still fail at its own 0.3 s
    async def answer(reader, writer, n):
        if n == 0:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
            return True
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n01")
        await writer.drain()
        await asyncio.sleep(5.0)
        return False

    async def main() -> None:
        server = Server(answer)
        async with server as url:
            pool = Pool(keepalive_s=30)
            assert await (await pool.post(url, b"{}", {}, 600)).read() == b"ok"
            response = await pool.post(url, b"{}", {}, 0.3)
            with pytest.raises(asyncio.TimeoutError):
                await response.read()
            response.close()
            assert server.connections == 1  # the same kept-alive connection carried both
            await pool.aclose()

    run(lambda: asyncio.wait_for(main(), 4.0))
