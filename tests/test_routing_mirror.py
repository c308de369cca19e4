"""Approximate mode shapes its prefix index like the engines' caches (middleware/routing/mirror.py):
the block size and KV cache size an engine reports replace the defaults the route left unset,
never the ones it set; and PrefixIndex.resize, which the size goes through."""

from __future__ import annotations

import logging
import random

import pytest

from kvgate.index.kv.prefix import EVENT_FED_CAPACITY, LRU_SHARD_BLOCKS, PrefixIndex
from kvgate.middleware.config import ReplicaConfig
from kvgate.middleware.engines.base import EngineInfo
from kvgate.middleware.routing.router import Router
from kvgate.middleware.routing_config import PrefixConfig, RoutingConfig

VLLM = EngineInfo("vllm", block_size=128, kv_cache_tokens=46_592)  # a CPU build's, as it reports them


def router(replicas: tuple[ReplicaConfig, ...] = (), **prefix: object) -> Router:
    reps = replicas or (
        ReplicaConfig(name="r0", api_base="http://127.0.0.1:9/v1"),
        ReplicaConfig(name="r1", api_base="http://127.0.0.1:9/v1"),
    )
    return Router(list(reps), RoutingConfig(prefix=PrefixConfig(**{"tokenizer": "codepoints", **prefix})))


def conversation(words: int, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [{"role": "user", "content": " ".join(f"w{rng.randrange(10**6)}" for _ in range(words))}]


def route(r: Router, messages: list[dict[str, str]]) -> str:
    plan = r.plan(messages)
    replica = r.choose(plan)
    assert replica is not None
    r.finished(
        r.started(replica, plan), True, r.answer_hashes(plan, [*messages, {"role": "assistant", "content": "ok"}])
    )
    r.settle(5)
    return replica.name


def test_an_engines_block_size_and_cache_size_replace_the_unset_defaults() -> None:
    r = router()
    try:
        assert r.block_size == 16 and r.index.capacity("r0") == EVENT_FED_CAPACITY
        msgs = conversation(300)
        early = r.plan(msgs)  # hashed in blocks of 16, before the engine said its own
        held = route(r, msgs)
        assert r.index.blocks(held) > 0
        r.mirror.engine_found("r0", VLLM)
        assert r.block_size == 128 and r.hasher is not None and r.hasher.block_size == 128
        # hashes of 16 never match hashes of 128: the index starts again, each replica at its engine's size
        assert r.index.blocks(held) == 0
        assert r.index.capacity("r0") == 46_592 // 128 and r.index.capacity("r1") == EVENT_FED_CAPACITY
        assert r.answer_hashes(early, [*msgs, {"role": "assistant", "content": "ok"}]) is None
        r.mirror.engine_found("r1", VLLM)
        assert r.index.capacity("r1") == 46_592 // 128
        assert r.stats()["r1"]["capacity_blocks"] == 46_592 // 128
        # from here a prompt's expected cached tokens count whole engine blocks only
        again = route(r, msgs)
        plan = r.plan([*msgs, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}])
        assert plan.expected_cached_tokens(again) % 128 == 0 and plan.expected_cached_tokens(again) > 0
    finally:
        r.close()


def test_a_smaller_engine_cache_evicts_the_oldest_conversations_first() -> None:
    r = router()
    try:
        r.mirror.engine_found("r0", EngineInfo("vllm", block_size=128, kv_cache_tokens=128 * 400))
        r.mirror.engine_found("r1", EngineInfo("vllm", block_size=128, kv_cache_tokens=128 * 400))
        chats = [conversation(600, seed=i) for i in range(40)]  # ~35 blocks each, 1400 in all
        placed = [route(r, m) for m in chats]
        assert all(r.index.blocks(n) <= 400 for n in ("r0", "r1"))
        newest, oldest = r.plan(chats[-1]), r.plan(chats[0])
        assert newest.matched_blocks[placed[-1]] == len(newest.hashes)
        assert oldest.matched_blocks[placed[0]] == 0  # gone, as it is from an engine of that size
    finally:
        r.close()


def test_what_the_route_sets_stays_and_a_different_engine_block_is_said(caplog: pytest.LogCaptureFixture) -> None:
    fixed = (
        ReplicaConfig(name="r0", api_base="http://127.0.0.1:9/v1", capacity_blocks=5000),
        ReplicaConfig(name="r1", api_base="http://127.0.0.1:9/v1"),
    )
    r = router(fixed, block_size=16)
    try:
        with caplog.at_level(logging.WARNING, logger="kvgate.router"):
            r.mirror.engine_found("r0", VLLM)
            r.mirror.engine_found("r0", VLLM)
            r.mirror.engine_found("r1", VLLM)
        assert r.block_size == 16
        said = [m for m in caplog.messages if "routing.prefix.block_size says 16" in m]
        assert len(said) == 2 and "replica r0" in said[0] and "replica r1" in said[1]  # once per replica
        # the replica's own bound stays; the other mirrors its engine, in the route's blocks of 16
        assert r.index.capacity("r0") == 5000 and r.index.capacity("r1") == 46_592 // 16
        r.add_replica(ReplicaConfig(name="r2", api_base="http://127.0.0.1:9/v1", capacity_blocks=7))
        r.mirror.engine_found("r2", VLLM)
        assert r.index.capacity("r2") == 7
    finally:
        r.close()

    bounded = router(capacity_blocks=9000)
    try:
        bounded.mirror.engine_found("r0", VLLM)
        assert bounded.block_size == 128 and bounded.index.capacity("r0") == 9000
    finally:
        bounded.close()


def test_the_text_tokenizer_takes_nothing_from_an_engine() -> None:
    r = router(tokenizer="text")
    try:
        r.mirror.engine_found("r0", VLLM)
        assert r.block_size == 64 and r.index.capacity("r0") == EVENT_FED_CAPACITY
    finally:
        r.close()


def test_resize_keeps_each_shards_order_and_evicts_the_oldest() -> None:
    ix = PrefixIndex(4 * LRU_SHARD_BLOCKS)
    ix.add_replica("a")
    ix.add_replica("b")
    rng = random.Random(1)
    chains = [[rng.getrandbits(63) for _ in range(100)] for _ in range(200)]  # 20,000 blocks over 4 shards
    for c in chains:
        ix.record("a", c)
        ix.record("b", c)
    assert ix.resize("a", 4 * LRU_SHARD_BLOCKS) == []  # the same bound: nothing moves
    evicted = ix.resize("a", 3000)
    assert len(evicted) == 17_000 and ix.blocks("a") == 3000 and ix.capacity("a") == 3000
    assert ix.match(chains[-1]) == {"a": 100, "b": 100}  # the newest chains stay whole
    assert ix.match(chains[0]) == {"a": 0, "b": 100}  # the oldest went, from "a" only
    assert ix.stats()["unique_blocks"] == 20_000
    assert ix.resize("a", None) == [] and ix.blocks("a") == 3000  # growing keeps everything
    ix.record("a", chains[0])
    assert ix.match(chains[0])["a"] == 100
    with pytest.raises(ValueError):
        ix.resize("a", -1)
    with pytest.raises(KeyError):
        ix.resize("nobody", 10)
