"""/metrics end to end: sim replicas publish KV events over ZMQ, the proxy routes in precise mode,
and the scrape shows each replica's load, prefix index and event feed, and the stores' soft
failures, read from the live objects."""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any, Callable, Iterator

import httpx
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from kvgate.engines.api import publisher_callbacks
from kvgate.engines.sim.engine import SimEngine
from kvgate.engines.sim.server import create_sim_app
from kvgate.index.kv.kv_events import KVEventBatch, encode_batch
from kvgate.index.kv.prefix import EVENT_FED_CAPACITY
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.cache.request_log import DiskRequestLog, RequestRecord, new_request_id
from kvgate.middleware.config import parse_config
from kvgate.middleware.pipeline import Pipeline
from kvgate.middleware.server.proxy import create_app
from kvgate.middleware.telemetry.metrics import Metrics
from kvgate.tools.bench.procs import ServerThread

BS = 16
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class TamperablePublisher:
    """A vLLM-framed PUB socket (``[topic, seq, payload]``) whose stream a test can damage."""

    def __init__(self, ctx: zmq.Context) -> None:
        self._sock = ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"tcp://127.0.0.1:{self._sock.bind_to_random_port('tcp://127.0.0.1')}"
        self._seq = 0
        self._lock = threading.Lock()  # the sim engine publishes from its server thread

    def publish(self, events: list[Any]) -> None:
        self.send(encode_batch(KVEventBatch(ts=time.time(), events=list(events))))

    def send(self, payload: bytes, skip: int = 0) -> None:
        with self._lock:
            self._seq += skip
            self._sock.send_multipart([b"", self._seq.to_bytes(8, "big"), payload])
            self._seq += 1

    def close(self) -> None:
        self._sock.close(0)


def scrape(client: httpx.Client) -> Samples:
    resp = client.get("/metrics")
    assert resp.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(resp.text)
        for s in fam.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{name}{labels} not exported"
    return samples[key]


def wait_for(
    client: httpx.Client, cond: Callable[[Samples], bool], timeout: float = 10.0, poke: Callable[[], None] | None = None
) -> Samples:
    deadline = time.time() + timeout
    while True:
        if poke is not None:
            poke()
        samples = scrape(client)
        if cond(samples):
            return samples
        assert time.time() < deadline, "metrics never reached the expected state"
        time.sleep(0.05)


@pytest.fixture
def precise_proxy(tmp_path) -> Iterator[tuple[httpx.Client, Pipeline, dict[str, TamperablePublisher]]]:
    ctx = zmq.Context()
    pubs = {name: TamperablePublisher(ctx) for name in ("r0", "r1")}
    # decode 20 tok/s: a 30-token answer streams for 1.5 s, long enough to scrape mid-request
    engines = {
        name: SimEngine(100_000, BS, prefill_tps=1e6, decode_tps=20, overhead_s=0.0, **publisher_callbacks(pub, BS))
        for name, pub in pubs.items()
    }
    replicas = {name: ServerThread(create_sim_app(engine, name)).start() for name, engine in engines.items()}
    config = parse_config(
        {
            "cache_dir": str(tmp_path / "cache"),
            "routes": [
                {
                    "name": "sim",
                    "model": "sim*",
                    "backend": {"model": "openai/sim", "api_key": "none", "timeout": 10},
                    "semantic": {"enabled": False},
                    "replicas": [
                        {"name": name, "api_base": f"{server.url}/v1", "events": pubs[name].endpoint}
                        for name, server in replicas.items()
                    ],
                    "routing": {
                        "policy": "cache_aware",
                        "mode": "precise",
                        "block_size": BS,
                        "tokenizer": "codepoints",
                    },
                }
            ],
        }
    )
    pipeline = build_pipeline(config)
    proxy = ServerThread(create_app(config, pipeline)).start()
    client = httpx.Client(base_url=proxy.url, timeout=30)
    try:
        yield client, pipeline, pubs
    finally:
        client.close()
        proxy.stop()
        pipeline.close()
        for server in replicas.values():
            server.stop()
        for pub in pubs.values():
            pub.close()
        ctx.term()


def test_metrics_export_replica_state_event_feeds_and_storage(precise_proxy) -> None:
    client, pipeline, pubs = precise_proxy
    route = "sim"
    first_publish = time.time()  # no batch of this test is older (their ts is time.time() when sent)

    def feeds_up(s: Samples) -> bool:
        return all(s.get(("kvgate_kv_events_batches_total", (("replica", r), ("route", route))), 0) > 0 for r in pubs)

    # ZMQ slow joiner: empty batches until both feeds have applied one
    before = wait_for(client, feeds_up, poke=lambda: [p.publish([]) for p in pubs.values()])
    for r in pubs:
        assert value(before, "kvgate_kv_events_received_total", route=route, replica=r) == 0  # empty batches only
        assert value(before, "kvgate_replica_prefix_blocks", route=route, replica=r) == 0

    served = []
    for i in range(4):
        prompt = f"Conversation {i}: " + f"tell me about topic {i} in detail, please. " * 12
        resp = client.post(
            "/v1/chat/completions",
            json={"model": "sim", "max_tokens": 2, "messages": [{"role": "user", "content": prompt}]},
        )
        assert resp.status_code == 200, resp.text
        served.append(resp.headers["x-kvgate-replica"])
    router = pipeline.routers[route]
    used = set(served)

    def events_in(s: Samples) -> bool:
        return all(s.get(("kvgate_kv_events_received_total", (("replica", r), ("route", route))), 0) > 0 for r in used)

    after = wait_for(client, events_in)
    for r in used:
        labels = {"route": route, "replica": r}
        batches = value(after, "kvgate_kv_events_batches_total", **labels)
        assert value(after, "kvgate_kv_events_received_total", **labels) > 0
        assert value(after, "kvgate_kv_events_blocks_stored_total", **labels) > 0
        assert value(after, "kvgate_replica_prefix_blocks", **labels) > 0  # the index learnt them from events
        assert value(after, "kvgate_kv_events_mapped_blocks", **labels) > 0
        assert value(after, "kvgate_kv_events_lag_seconds_count", **labels) == batches
        # applied after it was sent, and before this scrape: within the test's own window
        assert 0 <= value(after, "kvgate_kv_events_last_lag_seconds", **labels) <= time.time() - first_publish
        assert value(after, "kvgate_kv_events_lag_seconds_bucket", le="+Inf", **labels) == batches
        for name in (
            "decode_errors",
            "sequence_gaps",
            "missed_batches",
            "apply_errors",
            "publisher_restarts",
            "resyncs",
            "forgotten_mappings",
        ):
            assert value(after, f"kvgate_kv_events_{name}_total", **labels) == 0, name
        assert value(after, "kvgate_kv_events_ignored_total", reason="unknown_parent", **labels) == 0
    for r in pubs:
        labels = {"route": route, "replica": r}
        assert value(after, "kvgate_replica_requests_total", **labels) == served.count(r)
        assert value(after, "kvgate_replica_requests_in_flight", **labels) == 0
        assert value(after, "kvgate_replica_pending_prefill_tokens", **labels) == 0
        assert value(after, "kvgate_replica_marked_down_total", **labels) == 0
        assert value(after, "kvgate_replica_consecutive_failures", **labels) == 0
        assert value(after, "kvgate_replica_up", **labels) == 1
        assert value(after, "kvgate_replica_prefix_blocks", **labels) == router.index.blocks(r)
        assert value(after, "kvgate_replica_prefix_capacity_blocks", **labels) == EVENT_FED_CAPACITY  # precise default
        assert value(after, "kvgate_replica_prefix_evictions_total", **labels) == 0
    for store in ("responses", "request_log"):
        assert value(after, "kvgate_cache_storage_errors_total", store=store) == 0
    assert value(after, "kvgate_cache_damaged_items_total", store="responses") == 0

    # mid-stream the replica has one request in flight, and its prefill is no longer queued
    body = {
        "model": "sim",
        "stream": True,
        "max_tokens": 30,
        "messages": [{"role": "user", "content": "Stream a long story about a lighthouse keeper."}],
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        replica = resp.headers["x-kvgate-replica"]
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        mid = scrape(httpx.Client(base_url=str(client.base_url), timeout=10))
        assert value(mid, "kvgate_replica_requests_in_flight", route=route, replica=replica) == 1
        assert value(mid, "kvgate_replica_pending_prefill_tokens", route=route, replica=replica) == 0
        assert [line for line in lines if line][-1] == "data: [DONE]"
    done = scrape(client)
    assert value(done, "kvgate_replica_requests_in_flight", route=route, replica=replica) == 0
    assert value(done, "kvgate_replica_requests_total", route=route, replica=replica) == served.count(replica) + 1

    # a damaged stream: one undecodable payload, then three batch numbers skipped
    r1 = {"route": route, "replica": "r1"}
    pubs["r1"].send(b"\xc1 not msgpack")
    pubs["r1"].send(encode_batch(KVEventBatch(ts=time.time(), events=[])), skip=3)
    damaged = wait_for(
        client,
        lambda s: (
            value(s, "kvgate_kv_events_sequence_gaps_total", **r1) == 1
            and value(s, "kvgate_kv_events_resyncs_total", **r1) == 2
        ),
    )
    assert value(damaged, "kvgate_kv_events_decode_errors_total", **r1) == 1
    assert value(damaged, "kvgate_kv_events_missed_batches_total", **r1) == 3
    # each loss resyncs r1's view: its blocks are dropped until it stores them again
    assert value(damaged, "kvgate_kv_events_resyncs_total", **r1) == 2
    assert value(damaged, "kvgate_replica_prefix_blocks", **r1) == 0 == router.index.blocks("r1")


class _FailingDisk:
    """Stands in for a full disk under the request log's diskcache."""

    def set(self, *args: Any, **kwargs: Any) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    def close(self) -> None:
        pass


class _BrokenStore:
    def stats(self) -> dict[str, int]:
        raise OSError("gone")


def test_storage_soft_failures_are_scraped_from_the_stores(tmp_path) -> None:
    log = DiskRequestLog(tmp_path / "q", ttl=60, max_bytes=2**20)
    real_disk, log._disk = log._disk, _FailingDisk()  # every record now fails softly
    metrics = Metrics()
    metrics.watch({}, {"request_log": log, "broken": _BrokenStore()})
    for _ in range(3):
        log.record(new_request_id(), RequestRecord("t", "chat", "miss", "s", None))
    text = metrics.render().decode()  # the broken store is skipped, the scrape still works
    assert 'kvgate_cache_storage_errors_total{store="request_log"} 3.0' in text
    assert 'store="broken"' not in text
    real_disk.close()
