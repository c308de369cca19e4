"""The whole pipeline on real parts: proxy (precise mode) → two reference replicas sharing one
disk tier, following their KV events; a second turn lands where its KV is, and a replica that
never saw a conversation loads it from the shared disk instead of re-prefilling it."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from kvgate.engines.api import publisher_callbacks
from kvgate.engines.replica.engine import ReplicaEngine
from kvgate.engines.replica.model import load_model
from kvgate.engines.replica.server import create_replica_app
from kvgate.index.kv.chunks import ChunkStore, DiskTier, MemoryTier
from kvgate.index.kv.kv_events import ZmqEventPublisher
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import parse_config
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import ServerThread

CHUNK = 256


@pytest.fixture(scope="module")
def model_and_tokenizer() -> tuple[Any, Any]:
    return load_model("smollm2")


def conversation() -> list[dict[str, str]]:
    facts = " ".join(f"Note {i}: the river Ash floods every {i + 2} years." for i in range(45))
    return [
        {"role": "system", "content": "You answer briefly from the notes."},
        {"role": "user", "content": f"{facts}\nHow often does the river flood in note 3?"},
    ]


def test_precise_routing_over_reference_replicas(model_and_tokenizer, tmp_path):
    model, tok = model_and_tokenizer
    pubs = [ZmqEventPublisher("tcp://127.0.0.1:*") for _ in range(2)]
    stores = [
        ChunkStore([MemoryTier(256 << 20), DiskTier(tmp_path / "kv", 1 << 30)], "smollm2-135m:float32")
        for _ in range(2)
    ]
    callbacks = [publisher_callbacks(pub, CHUNK) for pub in pubs]
    engines = [
        ReplicaEngine(model, tok, store, chunk_tokens=CHUNK, on_stored=cb["on_stored"], on_removed=cb["on_removed"])
        for store, cb in zip(stores, callbacks)
    ]
    replicas = [ServerThread(create_replica_app(e, f"r{i}")).start() for i, e in enumerate(engines)]
    config = parse_config(
        {
            "cache_dir": str(tmp_path / "cache"),
            "routes": [
                {
                    "name": "local",
                    "model": "smol*",
                    "backend": {"model": "openai/smollm2", "api_key": "none", "timeout": 300},
                    "semantic": {"enabled": False},
                    "replicas": [
                        {"name": f"r{i}", "api_base": f"{r.url}/v1", "events": p.endpoint}
                        for i, (r, p) in enumerate(zip(replicas, pubs))
                    ],
                    "routing": {
                        "policy": "cache_aware",
                        "prefix": {"mode": "precise", "tokenizer": "smollm2", "block_size": CHUNK},
                    },
                }
            ],
        }
    )
    pipeline = build_pipeline(config)
    proxy = ServerThread(create_app(config, pipeline)).start()
    client = httpx.Client(base_url=proxy.url, timeout=300)
    try:
        messages = conversation()
        first = client.post("/v1/chat/completions", json={"model": "smollm2", "messages": messages, "max_tokens": 12})
        assert first.status_code == 200, first.text
        home = first.headers["x-kvgate-replica"]
        router = pipeline.routers["local"]
        deadline = time.time() + 10
        while router.index.blocks(home) == 0 and time.time() < deadline:  # events arrive over ZMQ
            time.sleep(0.05)
        assert router.index.blocks(home) >= 2 and router.index.blocks("r1" if home == "r0" else "r0") == 0

        messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "And in note 9?"}]
        second = client.post("/v1/chat/completions", json={"model": "smollm2", "messages": messages, "max_tokens": 12})
        assert second.status_code == 200, second.text
        assert second.headers["x-kvgate-replica"] == home
        cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= 2 * CHUNK

        # the other replica never computed this conversation: it loads it from the shared disk tier
        other = replicas[1] if home == "r0" else replicas[0]
        direct = httpx.post(
            f"{other.url}/v1/chat/completions",
            timeout=300,
            json={"model": "smollm2", "messages": messages, "max_tokens": 12},
        )
        # full chunks only: the partial tail after them lives in the home replica's RAM
        assert direct.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= cached // CHUNK * CHUNK >= 2 * CHUNK
        assert direct.json()["choices"][0]["message"]["content"] == second.json()["choices"][0]["message"]["content"]
    finally:
        client.close()
        proxy.stop()
        pipeline.close()
        for r in replicas:
            r.stop()
        for e in engines:
            e.close()
        for s in stores:
            s.close()
        for p in pubs:
            p.close()


def test_multi_turn_demo_example(model_and_tokenizer, tmp_path):
    """examples/multi_turn_demo.py against a proxy over one reference replica: turn 2 reuses KV."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    model, tok = model_and_tokenizer
    store = ChunkStore([MemoryTier(128 << 20), DiskTier(tmp_path / "kv", 256 << 20)], "smollm2-135m:float32")
    engine = ReplicaEngine(model, tok, store, chunk_tokens=CHUNK)
    replica = ServerThread(create_replica_app(engine, "r1")).start()
    config = parse_config(
        {
            "cache_dir": str(tmp_path / "cache"),
            "routes": [
                {
                    "name": "local",
                    "model": "smol*",
                    "backend": {"model": "openai/smollm2", "api_key": "none", "timeout": 300},
                    "replicas": [{"name": "r1", "api_base": f"{replica.url}/v1"}],
                    "routing": {"prefix": {"tokenizer": "smollm2", "block_size": CHUNK}},
                }
            ],
        }
    )
    pipeline = build_pipeline(config)
    proxy = ServerThread(create_app(config, pipeline)).start()
    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(
            [
                sys.executable,
                str(root / "examples" / "multi_turn_demo.py"),
                f"{proxy.url}/v1",
                "--turns",
                "2",
                "--max-tokens",
                "6",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
        assert out.returncode == 0, out.stderr
        turns = [line.split() for line in out.stdout.splitlines()[1:]]
        assert [t[0] for t in turns] == ["1", "2"]
        assert int(turns[0][2]) == 0 and int(turns[1][2]) >= CHUNK  # turn 2 loaded turn 1's chunks
    finally:
        proxy.stop()
        pipeline.close()
        replica.stop()
        engine.close()
        store.close()
