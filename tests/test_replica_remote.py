"""Two reference replicas (the real SmolLM2-135M) with separate KV dirs and one real Redis, built
from `kvgate replica` flags (--kv-dir, --kv-remote): turn 2 of a conversation on replica B loads
the chunks replica A wrote during turn 1 from Redis and answers exactly as a cold run does; with
Redis killed a third replica still answers 200 from a cold prefill, and says so in its metrics.
The model is loaded once; each replica is an engine over it behind its own HTTP app."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx
import pytest
from openai import OpenAI
from test_replica import CT, _scrape, long_chat

from kvgate.engines.replica.engine import ReplicaEngine
from kvgate.engines.replica.model import load_model, model_namespace
from kvgate.engines.replica.server import add_arguments, build_store, create_replica_app, remote_tier
from kvgate.tools.bench.procs import ServerThread


@pytest.fixture(scope="module")
def model_and_tokenizer() -> tuple[Any, Any]:
    return load_model("smollm2")


@pytest.fixture
def replicas(model_and_tokenizer: tuple[Any, Any], tmp_path: Path) -> Iterator[Any]:
    """start(name, *flags) -> (base url, engine): a replica app configured by `kvgate replica` flags."""
    made: list[Any] = []

    def start(name: str, *flags: str) -> tuple[str, ReplicaEngine]:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(["--port", "0", "--kv-dir", str(tmp_path / name), *flags])
        model, tok = model_and_tokenizer
        store = build_store(args.kv_dir, args.kv_ram_mb, args.kv_disk_mb, model_namespace(model), remote_tier(args))
        engine = ReplicaEngine(model, tok, store, chunk_tokens=args.chunk_tokens)
        server = ServerThread(create_replica_app(engine, name)).start()
        made.extend([server, engine, store])
        return server.url, engine

    yield start
    for thing in made:
        (thing.stop if isinstance(thing, ServerThread) else thing.close)()


def ask(url: str, messages: list[dict[str, Any]], max_tokens: int) -> Any:
    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    return client.chat.completions.create(model="smollm2", messages=messages, max_tokens=max_tokens, temperature=0)


def test_turn_two_on_another_replica_loads_turn_one_from_redis(replicas: Any, redis_server: Any) -> None:
    flags = ("--kv-remote", redis_server.url, "--kv-remote-timeout", "0.5")
    url_a, _ = replicas("a", *flags)
    url_b, _ = replicas("b", *flags)
    turn1 = long_chat(33, "What is 7 squared?")  # ~550 tokens: 2 chunks
    first = ask(url_a, turn1, 8)
    turn2 = turn1 + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And what is 8 squared?"},
    ]
    second = ask(url_b, turn2, 8)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # A stored the chunks of the prompt it prefilled (2 chunks); B loads them from Redis
    assert first.usage.prompt_tokens > 2 * CT
    assert cached >= 2 * CT, cached
    with httpx.Client(base_url=url_b) as http:
        m = _scrape(http)
    assert m[("kvgate_replica_kv_chunk_hits_total", frozenset({("tier", "remote")}))] >= 2
    assert m[("kvgate_replica_kv_remote_up", frozenset({("tier", "remote")}))] == 1
    # Redis killed: a replica that has nothing locally answers 200 from a cold prefill, and that
    # cold answer is the reference: B's answer from A's chunks must be token for token the same
    redis_server.proc.kill()
    redis_server.proc.wait()
    url_c, _ = replicas("c", *flags)
    third = ask(url_c, turn2, 8)
    assert third.usage.prompt_tokens_details.cached_tokens == 0
    assert second.choices[0].message.content == third.choices[0].message.content  # greedy: same tokens
    with httpx.Client(base_url=url_c) as http:
        m = _scrape(http)
    assert m[("kvgate_replica_kv_remote_up", frozenset({("tier", "remote")}))] == 0
    errors = sum(v for (name, labels), v in m.items() if name == "kvgate_replica_kv_remote_errors_total")
    assert errors >= 1
