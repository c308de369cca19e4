"""The proxy's one reader of its replicas' /metrics (middleware/telemetry/replica_poll.py): only the
samples kvgate reads are parsed (checked against prometheus_client's parser on a page a real vLLM
0.32 server served, tests/data/vllm-0.32-metrics.txt), one connection per replica serves every
read, and each engine's report reaches its router (prefill_time's rate and queue)."""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from kvgate.middleware.config import ReplicaConfig, RoutingConfig
from kvgate.middleware.forward.http_gets import PooledGets
from kvgate.middleware.routing.router import Router
from kvgate.middleware.telemetry.engine_metrics import replica_reading
from kvgate.middleware.telemetry.replica_poll import Poll, ReplicaPoller, engine_report, polled_routes
from kvgate.middleware.telemetry.replica_scrape import SCRAPED, parse_metrics
from kvgate.tools.bench.procs import ServerThread

VLLM_PAGE = (Path(__file__).parent / "data" / "vllm-0.32-metrics.txt").read_text()


def test_filtered_parse_reads_what_the_full_parser_reads() -> None:
    full = parse_metrics(VLLM_PAGE)
    fast = parse_metrics(VLLM_PAGE, SCRAPED)
    assert full is not None and fast is not None and len(full) > 300
    assert fast == {key: value for key, value in full.items() if key[0] in SCRAPED}
    reading = replica_reading(fast)
    assert reading is not None and reading.engine == "vllm"
    assert (reading.prompt_tokens, reading.cached_tokens, reading.prefill_tokens, reading.prefill_requests) == (
        2403.0,
        1152.0,
        1251.0,
        3.0,
    )
    assert reading.prefill_seconds == pytest.approx(5.688, abs=1e-3)
    report = engine_report(reading)
    assert (report.running, report.waiting, report.prefill_tokens) == (0.0, 0.0, 1251.0)


def test_filtered_parse_labels_escapes_and_bad_lines() -> None:
    names = {"a", "b"}
    assert parse_metrics('a{x="q\\"u\\\\o\\n",y="}{"} 3 1700000000\nab 9\n', names) == {
        ("a", (("x", 'q"u\\o\n'), ("y", "}{"))): 3.0
    }
    assert parse_metrics("b +Inf\n# HELP a text\nzz{broken 1\n", names) == {("b", ()): float("inf")}
    assert parse_metrics('a{x="1" 3\n', names) is None  # a line of a sample read must parse
    assert parse_metrics("a\n", names) is None and parse_metrics(None, names) is None


class FakeEngine:
    """Serves VLLM_PAGE on /metrics with its prefill counters grown at each read (400 tokens per
    prefill second), and notes the client port of every read (one port: one connection)."""

    def __init__(self, waiting: int) -> None:
        self.reads, self.ports, self.waiting = 0, [], waiting

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await self.serve(scope, receive, send)

        self.server = ServerThread(app).start()

    async def serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.reads += 1
        self.ports.append(scope["client"][1])
        n = self.reads
        page = re.sub(r"(vllm:request_prefill_kv_computed_tokens_sum\{[^}]*\}) \S+", rf"\1 {1000.0 * n}", VLLM_PAGE)
        page = re.sub(r"(vllm:request_prefill_time_seconds_sum\{[^}]*\}) \S+", rf"\1 {2.5 * n}", page)
        page = re.sub(r"(vllm:request_prefill_kv_computed_tokens_count\{[^}]*\}) \S+", rf"\1 {2.0 * n}", page)
        page = re.sub(r"(vllm:num_requests_waiting\{[^}]*\}) \S+", rf"\1 {float(self.waiting)}", page)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": page.encode()})


@pytest.mark.parametrize("client", [None, PooledGets], ids=["httpx", "pooled"])  # the proxy passes PooledGets
def test_one_poller_feeds_the_router_over_one_connection_per_replica(client) -> None:
    engines = {"a": FakeEngine(waiting=3), "b": FakeEngine(waiting=0)}
    replicas = [ReplicaConfig(name=n, api_base=f"{e.server.url}/v1") for n, e in engines.items()]
    router = Router(replicas, RoutingConfig(policy="prefill_time", engine_poll_s=0.1))
    pool = ThreadPoolExecutor(1)
    try:
        assert polled_routes({"r": router}, "never") == {"r": Poll(0.1, True)}  # it routes on them
        poller = ReplicaPoller({"r": router}, polled_routes({"r": router}, "never"))

        async def run() -> None:
            task = asyncio.create_task(poller.run(pool, client))
            while poller.reads < 4:
                await asyncio.sleep(0.02)
            task.cancel()

        asyncio.run(asyncio.wait_for(run(), 20))
        for name, engine in engines.items():
            assert engine.reads >= 4 and len(set(engine.ports)) == 1, (name, engine.ports)  # kept alive
            page = poller.latest[("r", name)]
            assert page is not None and {key[0] for key in page} <= SCRAPED
        rate, waiting = router.engine_load.view("a")
        assert rate == pytest.approx(400.0) and 0 < waiting <= 3 * 500.0  # 3 waiting of 500 tokens each, aged
        assert router.engine_load.view("b")[1] == 0.0
        chosen = router.choose(router.plan([{"role": "user", "content": "hi"}]))
        assert chosen is not None and chosen.name == "b"
    finally:
        pool.shutdown()
        router.close()
        for engine in engines.values():
            engine.server.stop()


def test_routes_nobody_reads_are_not_polled() -> None:
    router = Router([ReplicaConfig(name="a", api_base="http://127.0.0.1:9/v1")], RoutingConfig())
    try:
        assert polled_routes({"r": router}, "never") == {}  # cache_aware, no dashboard numbers
        assert polled_routes({"r": router}, "watched") == {"r": Poll(2.0, False)}  # the default interval
        assert polled_routes({"r": router}, "always") == {"r": Poll(2.0, True)}
        poller = ReplicaPoller({"r": router}, {})
        asyncio.run(asyncio.wait_for(poller.run(ThreadPoolExecutor(1)), 5))  # returns at once
        assert poller.reads == 0
    finally:
        router.close()


def test_watched_replicas_are_read_while_someone_looks_and_once_per_stale_scrape() -> None:
    """`watched`: nothing is read until the dashboard asks; then every interval for `watch_s`;
    then nothing again. A scrape of /metrics (`fresh`) gets one read when the last is stale,
    none when it is not; the dashboard's points take only pages read within their age."""
    engine = FakeEngine(waiting=0)
    router = Router([ReplicaConfig(name="a", api_base=f"{engine.server.url}/v1")], RoutingConfig(engine_poll_s=0.1))
    pool = ThreadPoolExecutor(1)
    try:
        poller = ReplicaPoller({"r": router}, polled_routes({"r": router}, "watched"), watch_s=0.5)

        async def run() -> None:
            task = asyncio.create_task(poller.run(pool, PooledGets))
            await asyncio.sleep(0.5)
            assert engine.reads == 0 and poller.readings() == {}  # nobody looked
            poller.watch()
            await asyncio.sleep(0.45)
            watched = engine.reads
            assert 3 <= watched <= 6, watched  # every 0.1 s while watched
            assert ("r", "a") in poller.readings() and ("r", "a") in poller.pages(0.2)
            await asyncio.sleep(0.5)
            stopped = engine.reads
            assert stopped - watched <= 2  # the watch ran out
            await asyncio.sleep(0.5)
            assert engine.reads == stopped  # and nothing since
            assert poller.readings() == {} and poller.pages(0.2) == {}  # stale: neither shown nor charted
            await poller.fresh(2.0)  # a scrape finds it stale: one read, waited for
            assert engine.reads == stopped + 1 and ("r", "a") in poller.readings()
            await poller.fresh(2.0)  # read just now: no read
            await asyncio.sleep(0.3)
            assert engine.reads == stopped + 1
            task.cancel()

        asyncio.run(asyncio.wait_for(run(), 20))
    finally:
        pool.shutdown()
        router.close()
        engine.server.stop()
