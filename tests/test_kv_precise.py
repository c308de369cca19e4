"""Precise mode stays precise and bounded: resync on lost KV events, removal per medium, the
index's and the applier's bounds under long random event streams, the config's default bound,
and the chunk store telling the replica which chunks no tier holds any more."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.engines.replica.announce import Announcer
from kvgate.index.kv.chunks import ChunkStore, DiskTier, KVChunk, MemoryTier, chunk_hashes
from kvgate.index.kv.hashing import block_hashes
from kvgate.index.kv.kv_events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventApplier,
    EventFeed,
    KVEventBatch,
    encode_batch,
)
from kvgate.index.kv.prefix import EVENT_FED_CAPACITY, PrefixIndex
from kvgate.middleware.config import PrefixConfig, RoutingConfig

BS = 4


def toks(n_blocks: int, start: int = 0) -> list[int]:
    return list(range(start, start + n_blocks * BS))


def two_replicas(capacity: int | None = None) -> tuple[PrefixIndex, EventApplier, EventApplier]:
    idx = PrefixIndex(capacity)
    idx.add_replica("a")
    idx.add_replica("b")
    return idx, EventApplier(idx, "a", BS), EventApplier(idx, "b", BS)


# -- resync on lost events ----------------------------------------------------------------------


def test_gap_drops_that_replicas_view_only_and_counts_a_resync() -> None:
    idx, ap_a, ap_b = two_replicas()
    feed_a, feed_b = EventFeed(ap_a), EventFeed(ap_b)
    t = toks(3)
    ours = block_hashes(t, BS)
    stored = encode_batch(KVEventBatch(0.0, [BlockStored([1, 2, 3], None, t, BS)]))
    feed_a.receive(0, stored)
    feed_b.receive(0, stored)
    assert idx.match(ours) == {"a": 3, "b": 3}

    # batches 1..2 of a lost (they might have removed blocks): a's view is dropped, b's kept
    feed_a.receive(3, encode_batch(KVEventBatch(0.0, [BlockStored([4], 3, toks(1, 500), BS)])))
    assert idx.match(ours) == {"a": 0, "b": 3}
    assert ap_a.our_hash(4) is None and ap_a.stats()["unknown_parent"] == 1  # its parent went with the view
    s = feed_a.stats()
    assert (s.gaps, s.missed_batches, s.resyncs, s.clears, s.mapped_blocks) == (1, 2, 1, 1, 0)
    assert feed_b.stats().resyncs == 0 and ap_b.stats()["mapped"] == 3

    # the view restarts from the events that follow
    feed_a.receive(4, encode_batch(KVEventBatch(0.0, [BlockStored([1, 2], None, t[: 2 * BS], BS)])))
    assert idx.match(ours) == {"a": 2, "b": 3}
    feed_a.receive(5, b"\xc1not msgpack")  # an undecodable batch is lost as well
    assert idx.match(ours) == {"a": 0, "b": 3} and feed_a.stats().resyncs == 2
    feed_a.malformed("4 frames")  # the transport's bad frames too
    assert feed_a.stats().resyncs == 3 and feed_a.stats().decode_errors == 2


# -- media ---------------------------------------------------------------------------------------


def test_a_block_leaves_the_index_when_its_last_medium_drops_it() -> None:
    idx, ap, _ = two_replicas()
    t = toks(2)
    ours = block_hashes(t, BS)
    ap.apply(BlockStored([1, 2], None, t, BS, medium=MEDIUM_GPU))
    ap.apply(BlockStored([1], None, [], BS, medium=MEDIUM_CPU))  # an offload copy: no tokens needed
    assert ap.media(1) == {"GPU", "CPU"} and ap.media(2) == {"GPU"}
    ap.apply(BlockRemoved([1, 2], MEDIUM_GPU))  # evicted from the GPU; 1 still in CPU memory
    assert ap.media(1) == {"CPU"} and ap.our_hash(2) is None
    assert idx.match(ours) == {"a": 1, "b": 0}
    ap.apply(BlockRemoved([1], "DISK"))  # a medium it was never in: nothing changes
    assert idx.match(ours) == {"a": 1, "b": 0}
    ap.apply(BlockRemoved([1], MEDIUM_CPU))
    assert idx.match(ours) == {"a": 0, "b": 0} and ap.stats()["mapped"] == 0

    ap.apply(BlockStored([1, 2], None, t, BS))  # no medium: vLLM's only one, the GPU
    ap.apply(BlockStored([1, 2], None, t, BS, medium=MEDIUM_CPU))
    ap.apply(BlockRemoved([1, 2]))  # no medium: gone from every medium
    assert idx.blocks("a") == 0 and ap.stats()["removed"] == 4


def test_two_engine_hashes_for_one_block_keep_it_until_both_are_removed() -> None:
    idx, ap, _ = two_replicas()
    t = toks(1)
    ap.apply(BlockStored([10], None, t, BS))
    ap.apply(BlockStored([20], None, t, BS))  # same tokens, another engine hash (LoRA, cache salt)
    assert ap.our_hash(10) == ap.our_hash(20) and idx.blocks("a") == 1
    ap.apply(BlockRemoved([10]))
    assert idx.blocks("a") == 1
    ap.apply(BlockRemoved([20]))
    assert idx.blocks("a") == 0 and ap.stats()["mapped"] == 0


# -- bounds ------------------------------------------------------------------------------------


def test_the_index_bound_evicts_least_recently_stored_and_forgets_the_mapping() -> None:
    idx = PrefixIndex(3, touch_on_match=True)
    idx.add_replica("a")
    ap = EventApplier(idx, "a", BS)
    assert ap.max_mapped == 6
    first, second = toks(2), toks(2, 100)
    ap.apply(BlockStored([1, 2], None, first, BS))
    ap.apply(BlockStored([3, 4], None, second, BS))  # 4 blocks > 3: the least recent one goes
    assert idx.blocks("a") == 3 and ap.stats()["bound_evictions"] == 1 and ap.stats()["mapped"] == 3
    assert ap.our_hash(2) is None  # first's tail went (chains are touched last to first)
    ap.apply(BlockStored([5], 2, toks(1, 8), BS))  # continuing from the evicted block: unknown parent
    assert ap.stats()["unknown_parent"] == 1
    assert idx.stats()["evictions"] == {"a": 1}


block_st = st.integers(0, 11)  # a small token alphabet per block: chains overlap and collide


@st.composite
def event_streams(draw: st.DrawFn) -> list[tuple]:
    """Operations: ("store", parent index or None, blocks, medium), ("remove", engine-hash
    indexes, medium), ("clear",), ("match", blocks)."""
    ops = []
    for _ in range(draw(st.integers(1, 80))):
        kind = draw(st.sampled_from(["store"] * 5 + ["remove"] * 2 + ["restore", "match", "clear"]))
        medium = draw(st.sampled_from([None, MEDIUM_GPU, MEDIUM_CPU]))
        if kind == "store":
            ops.append(
                (
                    "store",
                    draw(st.none() | st.integers(0, 200)),
                    draw(st.lists(block_st, min_size=1, max_size=5)),
                    medium,
                )
            )
        elif kind in ("remove", "restore"):
            ops.append((kind, draw(st.lists(st.integers(0, 200), min_size=1, max_size=6)), medium))
        elif kind == "match":
            ops.append(("match", draw(st.lists(block_st, max_size=6))))
        else:
            ops.append(("clear",))
    return ops


@settings(max_examples=150, deadline=None)
@given(event_streams(), st.integers(1, 12), st.sampled_from([None, 1, 3]))
def test_bounded_index_and_map_under_random_event_streams(ops, cap, per_block) -> None:
    idx = PrefixIndex(cap, touch_on_match=True)
    idx.add_replica("a")
    idx.add_replica("b")
    max_mapped = None if per_block is None else cap * per_block
    ap = EventApplier(idx, "a", BS, max_mapped=max_mapped)
    limit = ap.max_mapped
    assert limit == (2 * cap if per_block is None else cap * per_block)
    issued: list[int] = []  # engine hashes in the order they were published
    next_hash = 1
    for op in ops:
        if op[0] == "store":
            _, parent_i, blocks, medium = op
            parent = issued[parent_i % len(issued)] if parent_i is not None and issued else None
            new = list(range(next_hash, next_hash + len(blocks)))
            next_hash += len(blocks)
            issued += new
            tokens = [b for block in blocks for b in [block] * BS]
            ap.apply(BlockStored(new, parent, tokens, BS, medium=medium))
        elif op[0] in ("remove", "restore") and issued:
            hashes = [issued[i % len(issued)] for i in op[1]]
            if op[0] == "remove":
                ap.apply(BlockRemoved(hashes, op[2]))
            else:  # the same blocks in (maybe) another medium, without tokens
                ap.apply(BlockStored(hashes, None, [], BS, medium=op[2]))
        elif op[0] == "match":
            idx.match(block_hashes([b for block in op[1] for b in [block] * BS], BS))
        elif op[0] == "clear":
            ap.apply(AllBlocksCleared())
        # the bounds hold after every event
        assert idx.blocks("a") <= cap
        assert ap.stats()["mapped"] <= limit
        # and the index holds exactly the blocks some mapped engine hash maps to
        mapped = {h: ap.our_hash(h) for h in issued}
        ours = {o for o in mapped.values() if o is not None}
        assert all(idx.holds("a", o) for o in ours) and idx.blocks("a") == len(ours)
    assert idx.blocks("b") == 0


def test_the_prefix_index_is_bounded_by_default_in_both_modes() -> None:
    assert PrefixConfig(mode="precise").capacity_blocks == EVENT_FED_CAPACITY
    assert PrefixConfig(mode="precise", capacity_blocks=1000).capacity_blocks == 1000
    assert RoutingConfig().prefix.capacity_blocks == EVENT_FED_CAPACITY  # approximate too: never unbounded
    assert PrefixConfig(capacity_blocks=1000).capacity_blocks == 1000


def test_precise_router_index_and_applier_are_bounded_by_default() -> None:
    from kvgate.middleware.config import ReplicaConfig
    from kvgate.middleware.routing.router import Router

    replicas = [ReplicaConfig(name="r", api_base="http://127.0.0.1:9/v1", events="tcp://127.0.0.1:9")]
    router = Router(replicas, RoutingConfig(prefix=PrefixConfig(mode="precise", block_size=BS)))
    try:
        assert router.index.capacity("r") == EVENT_FED_CAPACITY
        applier = router.precise.subscribers["r"].applier
        assert applier.max_mapped == 2 * EVENT_FED_CAPACITY
        hot, cold = toks(2), toks(2, 100)
        applier.apply(BlockStored([1, 2], None, hot, BS))
        applier.apply(BlockStored([3, 4], None, cold, BS))
        assert router.index.match(block_hashes(hot, BS)) == {"r": 2}  # precise: matching touches
        rep = router.index._replicas["r"]  # the LRU is sharded at this capacity: hot is newer than cold in each shard
        for h in block_hashes(hot, BS):
            order = list(rep.shard(h))
            assert all(order.index(c) < order.index(h) for c in block_hashes(cold, BS) if c in order)
    finally:
        router.close()


# -- the chunk store reports what no tier holds --------------------------------------------------


def chunk(h: int) -> KVChunk:
    """~256 KiB encoded: big next to a diskcache directory's SQLite pages."""
    k = torch.full((2, 256, 64), float(h % 1000))
    return [(k, -k)]


def test_store_reports_a_chunk_removed_only_when_no_tier_holds_it(tmp_path: Path) -> None:
    size = 2 * 2 * 256 * 64 * 4
    memory = MemoryTier(int(2.5 * size))
    disk = DiskTier(tmp_path / "kv", int(4.5 * size) + (64 << 10))
    store = ChunkStore([memory, disk], "m:float32")
    gone: list[int] = []
    store.watch_removed(gone.extend)
    hs = chunk_hashes(list(range(8 * 16)), 16)
    store.put_many(hs[:3], [chunk(h) for h in hs[:3]])  # RAM holds 2: chunk 0 leaves RAM, not disk
    assert memory.stats()["evictions"] == 1 and gone == []
    assert store.longest_prefix(hs[:3]) == 3
    store.put_many(hs[3:6], [chunk(h) for h in hs[3:6]])  # the disk drops its oldest too
    assert disk.stats()["evictions"] >= 1
    assert gone and all(not store.longest_prefix([h]) for h in gone)
    assert set(gone) <= set(hs[:3]) and store.stats()["removed"] == len(gone)
    before = list(gone)
    assert len(store.get_many(hs[4:6])) == 2  # reads served from RAM: nothing more lost
    assert gone == before
    store.close()


def test_memory_only_store_reports_each_eviction(tmp_path: Path) -> None:
    store = ChunkStore([MemoryTier(int(2.5 * 2 * 256 * 64 * 4 * 2))], "m:float32")  # 2 chunks
    gone: list[int] = []
    store.watch_removed(gone.extend)
    store.watch_removed(lambda hs: 1 / 0)  # a broken listener is logged, the put goes on
    hs = chunk_hashes(list(range(4 * 16)), 16)
    store.put_many(hs, [chunk(h) for h in hs])
    assert gone == hs[:2] and store.longest_prefix(hs[2:]) == 2


def test_announcer_removes_only_announced_chunks_and_what_it_forgets() -> None:
    stored: list[list[int]] = []
    removed: list[list[int]] = []
    ann = Announcer(2, lambda h, t, p: stored.append(h), removed.append, memory=3)
    ann.stored([1, 2], [0] * 4)
    ann.removed([2, 99])  # 99 was never announced
    assert removed == [[2]]
    ann.stored([1, 2], [0] * 4)  # 2 is announced again after its removal, from parent 1
    assert stored == [[1, 2], [2]]
    ann.stored([5, 6, 7], [0] * 6)  # memory 3: the two least recent are forgotten and removed
    assert removed[-1] == [1, 2]
    with pytest.raises(ValueError):
        Announcer(2, memory=0)
