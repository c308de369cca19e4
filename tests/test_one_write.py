"""A response's head goes out with its first body bytes (middleware/server/one_write.py): over a
recording transport, a head and its body are one write, a head alone goes out at the end of the
loop's turn, closing sends what is held, and the bytes and their order are what was written; over
a real uvicorn server, responses of every shape arrive whole, and a head whose body waits on the
client is not held back."""

from __future__ import annotations

import asyncio
import socket
import threading

import httpx
import pytest

from kvgate.middleware.server.one_write import HeadHeldTransport, OneWriteHttp
from kvgate.middleware.server.quiet_server import QuietServer, server_config
from kvgate.tools.bench.procs import free_port

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"


class Recorder(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = self.aborted = self.eof = False

    def write(self, data) -> None:
        assert not self.closed, "a write after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def write_eof(self) -> None:
        self.eof = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


def _turn() -> None:
    """Run the loop's callbacks of this turn (and the next)."""
    asyncio.get_event_loop().run_until_complete(asyncio.sleep(0))


@pytest.fixture
def held():
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    raw = Recorder()
    yield raw, HeadHeldTransport(raw, loop)
    asyncio.set_event_loop(None)
    loop.close()


def test_a_head_and_its_body_are_one_write(held):
    raw, transport = held
    transport.write(HEAD)
    assert raw.writes == [] and transport.get_write_buffer_size() == 7 + len(HEAD)
    transport.write(b"hello")
    assert raw.writes == [HEAD + b"hello"]
    _turn()  # the turn's end finds nothing held
    assert raw.writes == [HEAD + b"hello"]


def test_a_head_alone_goes_out_at_the_end_of_the_turn(held):
    raw, transport = held
    transport.write(bytearray(HEAD))
    _turn()
    assert raw.writes == [HEAD]
    transport.write(memoryview(b"5\r\nhello\r\n"))  # a body part is never held
    assert raw.writes == [HEAD, b"5\r\nhello\r\n"]


def test_body_parts_pass_at_once_and_order_is_kept(held):
    raw, transport = held
    parts = [HEAD, b"a", b"HTTP/1.1 is a body here", b"b", b"c"]
    for part in parts:
        transport.write(part)
    _turn()
    assert b"".join(raw.writes) == b"".join(parts)
    assert raw.writes[0] == HEAD + b"a"


def test_closing_sends_what_is_held_and_abort_drops_it(held):
    raw, transport = held
    transport.write(HEAD)
    transport.close()
    assert raw.writes == [HEAD] and raw.closed
    _turn()  # the turn's flush finds the connection closed and held nothing
    assert raw.writes == [HEAD]
    raw2 = Recorder()
    other = HeadHeldTransport(raw2, asyncio.get_event_loop())
    other.write(HEAD)
    other.abort()
    _turn()
    assert raw2.writes == [] and raw2.aborted


def test_write_eof_and_writelines_and_the_rest_is_the_transports(held):
    raw, transport = held
    transport.writelines([HEAD, b"hel", b"lo"])
    _turn()
    assert raw.writes == [HEAD + b"hello"]
    transport.write(HEAD)
    transport.write_eof()
    assert raw.writes[-1] == HEAD and raw.eof
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1)
    assert transport.is_closing() is False


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path = scope["path"]
    if path == "/one":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        await send({"type": "http.response.body", "body": b"hello"})
    elif path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for k in range(5):
            await send({"type": "http.response.body", "body": b"part%d;" % k, "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b""})
    elif path == "/empty":
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
    elif path == "/late":  # the body waits until the client says it has the head
        gate: threading.Event = scope["app_gate"]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-head", b"1")]})
        while not await asyncio.to_thread(gate.wait, 0.05):
            pass
        await send({"type": "http.response.body", "body": b"late"})


def test_kvgate_serves_and_its_workers_run_on_the_one_write_protocol():
    assert server_config(app).http is OneWriteHttp
    assert server_config(app, http="h11").http == "h11"  # a caller's own choice stands


def test_a_real_server_serves_every_shape_over_one_connection():
    port = free_port()
    gate = threading.Event()

    async def gated(scope, receive, send):
        if scope["type"] == "http":
            scope["app_gate"] = gate
        await app(scope, receive, send)

    server = QuietServer(server_config(gated, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            for _ in range(50):
                try:
                    client.get("/one")
                    break
                except httpx.ConnectError:
                    threading.Event().wait(0.1)
            for _ in range(3):  # keep-alive: the same connection, request after request
                one = client.get("/one")
                assert (one.status_code, one.content) == (200, b"hello")
                stream = client.get("/stream")
                assert stream.content == b"".join(b"part%d;" % k for k in range(5))
                assert client.get("/empty").status_code == 204
                assert client.head("/one").content == b""
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:  # one write: one read
                raw.sendall(b"GET /one HTTP/1.1\r\nhost: x\r\n\r\n")
                first = raw.recv(65536)
                assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"\r\n\r\nhello")
            with client.stream("GET", "/late") as late:  # the head arrives although no body has come
                assert late.headers["x-head"] == "1"
                gate.set()
                assert late.read() == b"late"
    finally:
        server.stop()
        thread.join(10)
    assert not thread.is_alive()
