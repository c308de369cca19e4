"""The remote KV tier (kvgate.index.kv.chunks.redis.RedisTier) on a real redis-server: the StorageTier
contract, a ChunkStore of two "replicas" (own RAM + disk each) sharing one Redis in one round trip
per prompt, and faults: Redis killed (misses, skipped writes, backoff, reconnect), restarted empty
(misses), a damaged value (a miss and a delete)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import pytest
import redis
from test_chunks import NS, det_chunk, same_chunk

from kvgate.index.kv.chunks import BatchTier, ChunkStore, DiskTier, MemoryTier, StorageTier, chunk_hashes, encode_chunk
from kvgate.index.kv.chunks.redis import RedisTier


class CountingTier(RedisTier):
    """A RedisTier that counts its batch calls (each is one pipelined round trip)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.calls: dict[str, int] = {"contains_many": 0, "get_many": 0, "put_many": 0}

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        self.calls["contains_many"] += 1
        return super().contains_many(keys)

    def get_many(self, keys: Sequence[str]) -> list[bytes]:
        self.calls["get_many"] += 1
        return super().get_many(keys)

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[bool]:
        self.calls["put_many"] += 1
        return super().put_many(items)


def replica_store(tmp_path: Path, name: str, url: str, **kw: Any) -> tuple[ChunkStore, CountingTier]:
    remote = CountingTier(url, **kw)
    return ChunkStore([MemoryTier(10**7), DiskTier(tmp_path / name, 10**8), remote], NS), remote


def test_redis_tier_contract(redis_server: Any) -> None:
    tier = RedisTier(redis_server.url, prefix="t1", ttl_s=100, max_value_bytes=1000)
    assert isinstance(tier, StorageTier) and isinstance(tier, BatchTier) and tier.name == "remote"
    assert tier.get("a") is None and not tier.contains("a") and tier.get_many(["a"]) == []
    assert tier.put("a", b"one") and tier.put("a", b"other")  # present: kept as it is, counts as stored
    assert tier.get("a") == b"one" and tier.contains("a")
    assert tier.put_many([("b", b"two"), ("c", b"x" * 1001), ("d", b"four")]) == [True, False, True]
    assert tier.stats()["rejected"] == 1
    # a batch read stops at the first missing key; contains_many answers every key
    assert tier.get_many(["a", "b", "c", "d"]) == [b"one", b"two"]
    assert tier.contains_many(["a", "c", "d"]) == [True, False, True]
    raw = redis.Redis.from_url(redis_server.url)
    assert set(raw.keys("*")) == {b"t1:a", b"t1:b", b"t1:d"}
    # TTL: set on write, refreshed by a read (GETEX)
    raw.expire("t1:a", 5)
    tier.get("a")
    assert 95 <= raw.ttl("t1:a") <= 100
    # another prefix is another tier: it neither sees nor clears these keys
    other = RedisTier(redis_server.url, prefix="t2")
    assert not other.contains("a") and other.put("a", b"mine")
    other.clear()
    assert tier.get("a") == b"one" and sorted(tier.keys()) == ["a", "b", "d"]
    tier.delete("b")
    assert not tier.contains("b")
    s = tier.stats()
    assert s["up"] == 1 and s["items"] == 2 and s["bytes"] > 0 and s["budget_bytes"] == 0 and s["evictions"] == 0
    assert sum(s["errors_by_op"].values()) == 0
    tier.clear()
    assert list(tier.keys()) == []
    with pytest.raises(ValueError):
        RedisTier("http://nope:1")  # a URL redis-py cannot use: a start-up error, not an outage
    with pytest.raises(ValueError):
        RedisTier(redis_server.url, ttl_s=0)
    for t in (tier, other):
        t.close()


def test_two_replicas_share_chunks_in_one_round_trip_each_way(redis_server: Any, tmp_path: Path) -> None:
    a, remote_a = replica_store(tmp_path, "a", redis_server.url)
    b, remote_b = replica_store(tmp_path, "b", redis_server.url)
    hs = chunk_hashes(list(range(6 * 16)), 16)
    chunks = [det_chunk(h) for h in hs]
    assert a.put_many(hs, chunks) == 6
    assert remote_a.calls == {"contains_many": 1, "get_many": 0, "put_many": 1}
    assert b.longest_prefix(hs) == 6 and remote_b.calls["contains_many"] == 1
    got = b.get_many(hs)
    assert len(got) == 6 and all(same_chunk(x, y) for x, y in zip(got, chunks))
    assert remote_b.calls["get_many"] == 1  # the six chunks in one pipelined read
    assert b.stats()["writes"]["memory"] == 6  # RAM at once; the disk copies in the background
    b.drain()
    assert all(b.tiers[1].contains(b.key(h)) for h in hs)
    s = b.stats()
    assert s["hits"] == {"memory": 0, "disk": 0, "remote": 6} and s["promotions"] == 6
    assert s["writes"] == {"memory": 6, "disk": 6, "remote": 0}  # promoted into B's own tiers
    # B's RAM now serves the first chunks; a run after a local gap is read from Redis in one call
    b.clear("memory")
    b.clear("disk")
    for h in hs[:2]:
        b.tiers[0].put(b.key(h), encode_chunk(det_chunk(h), b.key(h)))
    calls = remote_b.calls["get_many"]
    assert len(b.get_many(hs)) == 6 and remote_b.calls["get_many"] == calls + 1
    assert b.stats()["hits"]["memory"] == 2
    # a gap in Redis: the walk and the read stop there
    remote_a.delete(a.key(hs[3]))
    b.clear("memory")
    b.clear("disk")
    assert b.longest_prefix(hs) == 3
    calls = remote_b.calls["get_many"]
    assert len(b.get_many(hs)) == 3 and remote_b.calls["get_many"] == calls + 1  # the gap costs no second trip
    # the namespace is part of the key: another model's store on the same Redis sees nothing
    other = ChunkStore([RedisTier(redis_server.url)], "other-model:float16")
    assert other.longest_prefix(hs) == 0
    for st in (a, b, other):
        st.close()


def test_damaged_value_is_a_miss_and_a_delete(redis_server: Any, tmp_path: Path) -> None:
    a, _ = replica_store(tmp_path, "a", redis_server.url)
    b, _ = replica_store(tmp_path, "b", redis_server.url)
    hs = [101, 102, 103]
    a.put_many(hs, [det_chunk(h) for h in hs])
    raw = redis.Redis.from_url(redis_server.url)
    key = f"kvgate:{a.key(102)}"
    value = bytearray(raw.get(key))
    value[len(value) // 2] ^= 0x01
    raw.set(key, bytes(value))
    got = b.get_many(hs)
    assert len(got) == 1 and same_chunk(got[0], det_chunk(101))
    s = b.stats()
    assert s["corrupt_by_tier"]["remote"] == 1 and not raw.exists(key)
    assert b.longest_prefix(hs) == 1
    a.close()
    b.close()


def test_redis_killed_then_restarted_empty_costs_misses_never_errors(redis_server: Any, tmp_path: Path) -> None:
    now = [0.0]  # the backoff's clock: it moves only when the test moves it
    store, remote = replica_store(
        tmp_path,
        "a",
        redis_server.url,
        timeout_s=0.5,
        connect_timeout_s=0.2,
        backoff_s=0.2,
        max_backoff_s=0.4,
        clock=lambda: now[0],
    )
    hs = chunk_hashes(list(range(4 * 16)), 16)
    chunks = [det_chunk(h) for h in hs]
    assert store.put_many(hs, chunks) == 4
    redis_server.proc.kill()
    redis_server.proc.wait()
    store.clear("memory")
    store.clear("disk")
    assert store.longest_prefix(hs) == 0 and store.get_many(hs) == []  # misses, not exceptions
    assert store.put_many(hs, chunks) == 4  # the local tiers take them; the remote write is skipped
    s = remote.stats()
    # one round trip found Redis dead; within the backoff nothing else waited on its timeouts
    assert s["up"] == 0 and s["errors_by_op"]["contains"] == 1 and sum(s["errors_by_op"].values()) == 1
    assert s["skipped_by_op"]["put"] >= 1  # the remote write was not tried
    assert store.stats()["put_failures"] == 4 and len(store.get_many(hs)) == 4  # served locally
    redis_server.restart()  # empty: no persistence
    store.clear("memory")
    store.clear("disk")
    assert remote.stats()["up"] == 0  # the backoff has not passed: Redis is not tried yet
    deadline = time.monotonic() + 10
    while remote.stats()["up"] == 0 and time.monotonic() < deadline:
        now[0] += 1.0  # past the backoff: one operation tries again; its success marks Redis up
        time.sleep(0.05)
    assert remote.stats()["up"] == 1
    assert store.longest_prefix(hs) == 0 and store.get_many(hs) == []  # restarted empty: misses
    assert store.put_many(hs, chunks) == 4 and remote.contains(store.key(hs[0]))  # writes resume
    store.close()


def test_events_follow_chunks_to_the_remote_medium_and_back(redis_server: Any) -> None:
    """A chunk evicted from RAM but still in Redis is announced moved (BlockStored REMOTE, then
    BlockRemoved CPU): the router keeps it for this replica; used again, it moves back; gone from
    every tier, it is removed. Real ChunkStore, RedisTier, Announcer and router-side EventApplier."""
    from kvgate.engines.api import publisher_callbacks
    from kvgate.engines.replica.announce import LOCAL, REMOTE, Announcer
    from kvgate.index.kv.kv_events import MEDIUM_CPU, MEDIUM_REMOTE, EventApplier
    from kvgate.index.kv.prefix import PrefixIndex

    assert (LOCAL, REMOTE) == (MEDIUM_CPU, MEDIUM_REMOTE)
    ct = 4
    size = len(encode_chunk(det_chunk(1), "kv:" + NS + ":" + "0" * 16))
    remote = RedisTier(redis_server.url)
    store = ChunkStore([MemoryTier(2 * size + 64), remote], NS)  # RAM holds two chunks
    index = PrefixIndex()
    index.add_replica("r1")
    applier = EventApplier(index, "r1", block_size=ct)

    class Publisher:  # applies what the replica would publish, in order
        def publish(self, events: list[Any]) -> None:
            for ev in events:
                applier.apply(ev)

    cb = publisher_callbacks(Publisher(), ct, medium=MEDIUM_CPU)
    ann = Announcer(ct, cb["on_stored"], cb["on_removed"])
    store.watch_removed(ann.removed)
    store.watch_demoted(ann.demoted)

    def turn(tokens: list[int]) -> list[int]:
        hs = chunk_hashes(tokens, ct)
        store.put_many(hs, [det_chunk(h) for h in hs])
        store.get_many(hs)
        ann.stored(hs, tokens)
        return hs

    first = turn(list(range(8)))
    assert index.match(first)["r1"] == 2 and applier.media(first[0]) == {MEDIUM_CPU}
    second = turn(list(range(100, 108)))  # evicts the first chain from RAM; Redis still has it
    assert index.match(first)["r1"] == 2 and applier.media(first[0]) == {MEDIUM_REMOTE}
    turn(list(range(8)))  # loaded back from Redis into RAM (and the second chain demoted)
    assert applier.media(first[1]) == {MEDIUM_CPU} and applier.media(second[0]) == {MEDIUM_REMOTE}
    for h in first:
        remote.delete(store.key(h))
    turn(list(range(200, 208)))  # evicts the first chain, which no tier holds any more
    assert index.match(first)["r1"] == 0 and index.match(second)["r1"] == 2
    store.close()


def test_password_from_the_environment_and_a_wrong_one_is_an_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvgate.tools.redis_proc import RedisServer

    with RedisServer(password="s3cret") as server:
        good = RedisTier(server.url, password="s3cret")
        assert good.put("k", b"v") and good.get("k") == b"v"
        bad = RedisTier(server.url, password="wrong", backoff_s=0.05, max_backoff_s=0.1)
        assert bad.get("k") is None and not bad.put("k2", b"v")  # misses and skipped writes, no exception
        assert bad.stats()["up"] == 0 and bad.stats()["errors_by_op"]["get"] == 1
        # `kvgate replica` takes the password from the variable --kv-remote-password-env names
        import argparse

        from kvgate.engines.replica.server import add_arguments, remote_tier

        parser = argparse.ArgumentParser()
        add_arguments(parser)
        monkeypatch.setenv("KVGATE_TEST_REDIS_PW", "s3cret")
        args = parser.parse_args(
            [
                "--port",
                "1",
                "--kv-remote",
                server.url,
                "--kv-remote-password-env",
                "KVGATE_TEST_REDIS_PW",
                "--kv-remote-prefix",
                "p",
            ]
        )
        tier = remote_tier(args)
        assert tier.put("k3", b"w") and tier.get("k3") == b"w" and tier.prefix == "p:"
        for flags, named in (
            (["--kv-remote-password-env", "KVGATE_TEST_UNSET_VAR"], "--kv-remote-password-env"),
            (["--kv-remote-ttl", "-1"], "--kv-remote-ttl"),
            (["--kv-remote-timeout", "0"], "--kv-remote"),
        ):
            args = parser.parse_args(["--port", "1", "--kv-remote", server.url, *flags])
            with pytest.raises(ValueError, match=named):
                remote_tier(args)
        args = parser.parse_args(["--port", "1", "--kv-remote", "http://example:1"])
        with pytest.raises(ValueError, match="--kv-remote"):
            remote_tier(args)
        for t in (good, bad, tier):
            t.close()


def test_promoter_runs_in_order_drops_when_full_and_drains() -> None:
    import threading

    from kvgate.index.kv.chunks.promoter import Promoter

    done: list[int] = []
    started, go = threading.Event(), threading.Event()

    def first() -> None:
        started.set()
        go.wait(10)
        done.append(1)

    p = Promoter(depth=1)
    assert p.submit(first) and started.wait(10)  # the thread holds job 1: one queue slot is free
    assert p.submit(lambda: done.append(2))
    assert not p.submit(lambda: done.append(3)) and p.dropped == 1  # full: dropped, not waited for
    go.set()
    p.drain()
    assert done == [1, 2]
    assert p.submit(lambda: 1 / 0)  # a failing copy is logged; the thread goes on
    p.drain()
    assert p.submit(lambda: done.append(4))
    p.close()
    assert done == [1, 2, 4] and not p.submit(lambda: None)


def test_held_copies_wait_for_the_release_or_at_most_max_hold() -> None:
    import threading

    from kvgate.index.kv.chunks.promoter import Promoter

    ran = threading.Event()
    p = Promoter(max_hold_s=30)
    p.hold(True)  # the replica is prefilling
    assert p.submit(ran.set)
    assert not ran.wait(0.5)  # held: not run yet
    p.hold(False)
    assert ran.wait(10)
    p.drain()
    assert p.overdue == 0  # it ran on the release
    p.close()

    ran.clear()
    p = Promoter(max_hold_s=0.3)
    p.hold(True)  # never released: the copy still runs once it has waited max_hold_s
    assert p.submit(ran.set) and ran.wait(10)
    p.drain()
    assert p.overdue == 1  # it ran because its wait for the release ran out, not by skipping the wait
    p.close()


def test_a_remote_only_store_reads_without_writing_back(redis_server: Any) -> None:
    store = ChunkStore([CountingTier(redis_server.url)], NS)
    hs = [7, 8]
    store.put_many(hs, [det_chunk(h) for h in hs])
    assert len(store.get_many(hs)) == 2
    s = store.stats()
    assert s["writes"] == {"remote": 2} and s["promotions"] == 0 and store.tiers[0].calls["put_many"] == 1
    store.close()
