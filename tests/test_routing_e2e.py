"""Routing misses across replicas through the proxy: prefix stickiness, failover, re-admission."""

from __future__ import annotations

import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from kvgate.engines.demo import Calls, create_fake_app
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import parse_config
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import ServerThread
from tests.conftest import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    def __init__(self, name: str, port: int | None = None) -> None:
        self.name, self.port, self.calls = name, port or free_port(), Calls()
        self.server = ServerThread(create_fake_app(self.calls), port=self.port).start()

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        self.server = ServerThread(create_fake_app(self.calls), port=self.port).start()


@pytest.fixture
def cluster(embedder, tmp_path):
    reps = [Replica(f"r{i}") for i in range(3)]
    started = []

    def make(policy="cache_aware", **routing):
        config = parse_config(
            {
                "cache_dir": str(tmp_path / f"cache-{policy}-{len(started)}"),
                "routes": [
                    {
                        "name": "local",
                        "model": "smol*",
                        "backend": {"model": "openai/smollm2", "api_key": "none", "timeout": 5},
                        "semantic": {"enabled": False},  # these tests are about routing misses
                        "replicas": [{"name": r.name, "api_base": f"http://127.0.0.1:{r.port}/v1"} for r in reps],
                        "routing": {
                            "policy": policy,
                            "block_size": 16,
                            "tokenizer": "smollm2",
                            "probe_interval_s": 0.2,
                            **routing,
                        },
                    }
                ],
            }
        )
        pipeline = build_pipeline(config, embedder=embedder)
        server = ServerThread(create_app(config, pipeline)).start()
        started.append((server, pipeline))
        return httpx.Client(base_url=server.url, timeout=30), pipeline

    yield reps, make
    for server, pipeline in started:
        server.stop()
        pipeline.close()
    for r in reps:
        r.stop()


def converse(client, opener: str, turns: int, suffix: str = "") -> list[str]:
    messages = [
        {"role": "system", "content": "You are a travel guide. " * 20},
        {"role": "user", "content": opener + suffix},
    ]
    served = []
    for t in range(turns):
        resp = client.post("/v1/chat/completions", json={"model": "smollm2", "messages": messages})
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-kvgate-cache"] == "miss"
        served.append(resp.headers["x-kvgate-replica"])
        messages += [
            resp.json()["choices"][0]["message"],
            {"role": "user", "content": f"Tell me more, part {t}.{suffix}"},
        ]
    return served


def test_cache_aware_keeps_conversations_on_their_replica(cluster):
    reps, make = cluster
    client, pipeline = make("cache_aware")
    cities = ["Lisbon", "Kyoto", "Lima", "Oslo", "Cairo", "Quebec"]
    # concurrent conversations (each turn keeps the backend busy 0.2 s): the shared system prompt
    # pulls them together, the queued prefill work pushes them apart
    with ThreadPoolExecutor(6) as pool:

        def opener(city: str) -> str:
            return f"Plan a trip to {city}. I love {city}, its museums, food and history. " * 25

        served = list(pool.map(lambda c: converse(client, opener(c), 4, " [[sleep=0.2]]"), cities))
    for turns in served:
        assert len(set(turns)) == 1, served  # every turn goes where its prefix lives
    assert len({turns[0] for turns in served}) >= 2, served  # conversations spread over replicas
    router = pipeline.routers["local"]
    assert sum(s["blocks"] for s in router.stats().values()) > 0


def test_round_robin_scatters_turns(cluster):
    _, make = cluster
    client, _ = make("round_robin")
    assert len(set(converse(client, "Plan a trip to Lisbon.", 3))) == 3


def test_failover_and_readmission(cluster):
    reps, make = cluster
    client, pipeline = make("least_loaded")
    reps[0].stop()
    seen = Counter()
    for i in range(9):
        resp = client.post(
            "/v1/chat/completions",
            json={"model": "smollm2", "messages": [{"role": "user", "content": f"question {i}"}]},
        )
        assert resp.status_code == 200, resp.text  # no client-visible error
        seen[resp.headers["x-kvgate-replica"]] += 1
    assert "r0" not in seen
    router = pipeline.routers["local"]
    assert router.stats()["r0"]["healthy"] is False
    reps[0].restart()
    deadline = time.time() + 10
    while not router.stats()["r0"]["healthy"] and time.time() < deadline:
        time.sleep(0.1)
    assert router.stats()["r0"]["healthy"], "health probe did not re-admit r0"


def test_all_replicas_down_is_502(cluster):
    reps, make = cluster
    client, _ = make("cache_aware")
    for r in reps:
        r.stop()
    resp = client.post(
        "/v1/chat/completions", json={"model": "smollm2", "messages": [{"role": "user", "content": "anyone?"}]}
    )
    assert resp.status_code == 502 and resp.json()["error"]["type"] == "backend_error"


def test_streams_route_and_record(cluster):
    _, make = cluster
    client, pipeline = make("cache_aware")
    body = {
        "model": "smollm2",
        "stream": True,
        "messages": [{"role": "user", "content": "Stream me a story about a fox."}],
    }
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200 and resp.text.rstrip().endswith("data: [DONE]")
    replica = resp.headers["x-kvgate-replica"]
    assert pipeline.routers["local"].stats()[replica]["in_flight"] == 0


def test_precise_mode_follows_replica_events(embedder, tmp_path):
    """Replicas announce stored blocks over ZMQ (vLLM's KV-event format); the router follows them."""
    from kvgate.index.kv.kv_events import BlockRemoved, BlockStored, ZmqEventPublisher

    reps = [Replica(f"r{i}") for i in range(2)]
    pubs = [ZmqEventPublisher("tcp://127.0.0.1:*") for _ in reps]
    config = parse_config(
        {
            "cache_dir": str(tmp_path / "c"),
            "routes": [
                {
                    "name": "local",
                    "model": "smol*",
                    "backend": {"model": "openai/smollm2", "api_key": "none"},
                    "semantic": {"enabled": False},
                    "replicas": [
                        {"name": r.name, "api_base": f"http://127.0.0.1:{r.port}/v1", "events": p.endpoint}
                        for r, p in zip(reps, pubs)
                    ],
                    "routing": {"policy": "cache_aware", "mode": "precise", "block_size": 16, "tokenizer": "smollm2"},
                }
            ],
        }
    )
    pipeline = build_pipeline(config, embedder=embedder)
    server = ServerThread(create_app(config, pipeline)).start()
    try:
        router = pipeline.routers["local"]
        messages = [{"role": "user", "content": "Summarise the history of the printing press. " * 20}]
        tokens = router.hasher.tokens(messages)
        full = tokens[: len(tokens) // 16 * 16]
        engine_hashes = [1000 + i for i in range(len(full) // 16)]
        deadline = time.time() + 10
        while router.index.blocks("r1") == 0 and time.time() < deadline:  # ZMQ slow joiner: repeat
            pubs[1].publish([BlockStored(engine_hashes, None, full, 16)])
            time.sleep(0.1)
        assert router.index.blocks("r1") == len(engine_hashes)
        client = httpx.Client(base_url=server.url, timeout=30)
        for _ in range(3):
            resp = client.post(
                "/v1/chat/completions", json={"model": "smollm2", "messages": messages, "temperature": 0.1 * _}
            )
            assert resp.headers["x-kvgate-replica"] == "r1"
        assert router.index.blocks("r0") == 0  # precise mode: routing itself records nothing
        pubs[1].publish([BlockRemoved(engine_hashes)])
        assert wait_until(lambda: router.index.blocks("r1") == 0, 10)  # the engine's removal is followed
    finally:
        server.stop()
        pipeline.close()
        for p in pubs:
            p.close()
        for r in reps:
            r.stop()
