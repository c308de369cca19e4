"""EngineBook.discover: a burst of first requests makes one discovery, not one client each; a
replica that does not answer is asked again by the health loop's calls and at most once per
interval by requests, not by every request while it is down."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from fastapi import FastAPI

from kvgate.engines.demo import Calls, create_fake_app
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.forward.http_gets import PooledGets
from kvgate.middleware.routing.engines import EngineBook
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import ServerThread
from tests.conftest import one_replica_config


def _book() -> EngineBook:
    return EngineBook("r", "openai", cache_salt=False, salter=None, on_found=lambda name, info: None)


class _Counted(httpx.AsyncClient):
    made = 0

    def __init__(self, *args, **kwargs) -> None:
        type(self).made += 1
        super().__init__(*args, **kwargs)


@pytest.fixture()
def counted_clients(monkeypatch):
    _Counted.made = 0
    monkeypatch.setattr(httpx, "AsyncClient", _Counted)
    return _Counted


@pytest.fixture(scope="module")
def slow_replica():
    """An OpenAI-style replica whose model list takes 0.3 s (a discovery stays in flight) and
    counts the times it was asked."""
    app = FastAPI()
    asked: list[float] = []
    app.state.asked = asked

    @app.get("/v1/models")
    async def models() -> dict:
        asked.append(time.monotonic())
        await asyncio.sleep(0.3)
        return {"object": "list", "data": [{"id": "m"}]}

    srv = ServerThread(app).start()
    try:
        yield srv, app
    finally:
        srv.stop()


class _Refuser:
    """Accepts a connection and closes it at once (a replica that is up but never answers HTTP),
    counting connections: each one is a question asked."""

    def __init__(self) -> None:
        self.connections = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.close()

        self.server = self._loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> "_Refuser":
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"


def test_a_burst_of_first_requests_makes_one_discovery(slow_replica, counted_clients):
    srv, app = slow_replica
    app.state.asked.clear()
    book = _book()

    async def main() -> None:
        await asyncio.gather(*(book.discover([("a", f"{srv.url}/v1")], not_within=5.0) for _ in range(16)))

    asyncio.run(main())
    assert "a" in book.engines and book.engines["a"].kind == "openai"
    assert len(app.state.asked) == 1  # the fifteen that queued behind it found nothing left to ask
    assert counted_clients.made == 1  # nor made a client of their own


def test_a_replica_that_does_not_answer_is_asked_once_per_interval(counted_clients):
    with _Refuser() as replica:
        book = _book()
        ask = [("a", replica.url)]

        async def main() -> None:
            await asyncio.gather(*(book.discover(ask, not_within=5.0) for _ in range(8)))
            assert "a" not in book.engines
            first = replica.connections
            assert first >= 1  # the first request asked
            for _ in range(20):  # requests within the interval ask nothing, make no client
                await book.discover(ask, not_within=5.0)
            assert replica.connections == first
            assert counted_clients.made == 1
            await book.discover(ask)  # the health loop's call asks whatever the interval
            assert replica.connections > first
            again = replica.connections
            await asyncio.sleep(0.06)
            await book.discover(ask, not_within=0.05)  # a request once the interval passed asks again
            assert replica.connections > again

        asyncio.run(main())


def test_requests_after_the_first_discovery_do_not_wait(counted_clients):
    with _Refuser() as replica:
        book = _book()
        ask = [("a", replica.url)]

        async def main() -> None:
            assert book.discover_later(ask, 5.0) is False  # nothing asked yet: the caller waits on discover
            assert replica.connections == 0
            await book.discover(ask, not_within=5.0)
            first = replica.connections
            for _ in range(20):  # within the interval: no wait, nothing asked
                assert book.discover_later(ask, 5.0) is True
            await asyncio.sleep(0.05)
            assert replica.connections == first
            await asyncio.sleep(0.06)
            closed: list[bool] = []

            class Gets(PooledGets):
                async def aclose(self) -> None:
                    closed.append(True)
                    await super().aclose()

            for _ in range(20):  # past it: one ask, in the background, for all twenty
                assert book.discover_later(ask, 0.05, Gets) is True
            for _ in range(500):  # until the background discovery is done with its client
                if closed:
                    break
                await asyncio.sleep(0.01)
            assert replica.connections == 2 * first  # one more discovery, as many connections as the first
            assert counted_clients.made == 1  # on the client it was given, closed once done
            assert closed == [True]

        asyncio.run(main())


def test_requests_to_a_route_with_a_replica_down_do_not_each_ask_it(tmp_path):
    """Through the proxy's app: thirty requests while one of the route's two replicas never
    answers; the live one serves them all, and the dead one is asked by the discoveries, the
    health loop and any failover, not once per request."""
    live = ServerThread(create_fake_app(Calls())).start()
    with _Refuser() as dead:
        config = one_replica_config(tmp_path / "cache", live.url)
        route = config.routes[0]
        route.replicas.append(type(route.replicas[0])(name="dead", api_base=dead.url))
        pipeline = build_pipeline(config)
        app = create_app(config, pipeline)

        async def main() -> list[int]:
            transport = httpx.ASGITransport(app=app)
            async with (
                app.router.lifespan_context(app),
                httpx.AsyncClient(transport=transport, base_url="http://kvgate", timeout=30) as client,
            ):
                out = []
                for i in range(30):
                    body = {"model": "smollm2", "messages": [{"role": "user", "content": f"question {i}"}]}
                    out.append((await client.post("/v1/chat/completions", json=body)).status_code)
                return out

        try:
            assert asyncio.run(main()) == [200] * 30
            assert dead.connections < 10, dead.connections
        finally:
            pipeline.close()
            live.stop()
