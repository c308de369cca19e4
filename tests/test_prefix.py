"""PrefixIndex: leading-match semantics, LRU capacity, events, replicas, agreement with a
brute-force model."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.index.kv.hashing import block_hashes
from kvgate.index.kv.prefix import PrefixIndex


def chain(n: int, start: int = 0) -> list[int]:
    """Distinct stand-in hashes; the index treats hashes as opaque keys."""
    return list(range(1000 + start, 1000 + start + n))


def make(*names: str, capacity: int | None = None) -> PrefixIndex:
    idx = PrefixIndex(capacity_blocks=capacity)
    for n in names:
        idx.add_replica(n)
    return idx


def test_match_counts_leading_blocks_per_replica() -> None:
    idx = make("a", "b", "c")
    c = chain(10)
    idx.record("a", c[:10])
    idx.record("b", c[:4])
    assert idx.match(c) == {"a": 10, "b": 4, "c": 0}
    assert idx.match(c[:2]) == {"a": 2, "b": 2, "c": 0}
    assert idx.match([]) == {"a": 0, "b": 0, "c": 0}
    assert idx.match([1, 2, 3]) == {"a": 0, "b": 0, "c": 0}


def test_match_stops_at_first_gap() -> None:
    idx = make("a", "b")
    c = chain(8)
    idx.stored("a", c)
    idx.stored("b", c)
    idx.removed("b", [c[3]])  # b lacks block 3 but still has 4..7
    assert idx.match(c) == {"a": 8, "b": 3}
    idx.removed("a", [c[0]])
    assert idx.match(c) == {"a": 0, "b": 3}


def test_match_with_real_hash_chains() -> None:
    idx = make("a", "b")
    sys_prompt = list(range(64))
    h1 = block_hashes(sys_prompt + [7] * 32, 16)
    h2 = block_hashes(sys_prompt + [9] * 48, 16)
    idx.record("a", h1)
    idx.record("b", h2)
    assert idx.match(h1) == {"a": 6, "b": 4}
    assert idx.match(h2) == {"a": 4, "b": 7}


def test_record_lru_evicts_tail_of_oldest_chain_first() -> None:
    idx = make("a", capacity=6)
    old, new = chain(4, 0), chain(4, 100)
    assert idx.record("a", old) == []
    evicted = idx.record("a", new)
    # Blocks are touched last-to-first, so within a chain the tail is least recent (as vLLM
    # frees a request's blocks in reverse): the old chain loses its tail, keeps its head.
    assert evicted == [old[3], old[2]]
    assert idx.blocks("a") == 6
    assert idx.match(old) == {"a": 2}
    assert idx.match(new) == {"a": 4}
    assert idx.stats()["evictions"] == {"a": 2}


def test_record_touch_protects_reused_chain() -> None:
    idx = make("a", capacity=6)
    x, y, z = chain(3, 0), chain(3, 100), chain(3, 200)
    idx.record("a", x)
    idx.record("a", y)
    idx.record("a", x)  # x is hot again
    assert sorted(idx.record("a", z)) == sorted(y)
    assert idx.match(x) == {"a": 3} and idx.match(y) == {"a": 0}


def test_chain_longer_than_capacity_keeps_its_head() -> None:
    idx = make("a", capacity=3)
    c = chain(5)
    assert idx.record("a", c) == [c[4], c[3]]
    assert idx.match(c) == {"a": 3}


def test_match_does_not_touch_lru() -> None:
    idx = make("a", capacity=4)
    x, y, z = chain(2, 0), chain(2, 100), chain(2, 200)
    idx.record("a", x)
    idx.record("a", y)
    idx.match(x)  # must not make x recent
    assert sorted(idx.record("a", z)) == sorted(x)


def test_touch_on_match_keeps_hot_blocks_at_the_bound() -> None:
    """Precise mode: a block matched often survives the bound although it was stored long ago
    (engine hits produce no events); matched chains are touched last to first, head kept."""
    idx = PrefixIndex(capacity_blocks=4, touch_on_match=True)
    idx.add_replica("a")
    idx.add_replica("b")
    hot, y, z = chain(2, 0), chain(2, 100), chain(2, 200)
    idx.stored("a", hot)
    idx.stored("a", y)
    idx.stored("b", hot[:1])
    assert idx.match(hot) == {"a": 2, "b": 1}  # makes hot the most recent on a (and b)
    assert sorted(idx.stored("a", z)) == sorted(y)
    assert idx.match(hot) == {"a": 2, "b": 1}
    assert idx.stored("a", chain(1, 300)) == [z[1]]  # z, stored after hot but not matched since, goes first
    assert idx.holds("a", hot[0]) and idx.capacity("a") == 4


def test_per_replica_capacity_and_default() -> None:
    idx = PrefixIndex(capacity_blocks=2)
    idx.add_replica("small")
    idx.add_replica("big", capacity_blocks=10)
    c = chain(5)
    idx.record("small", c)
    idx.record("big", c)
    assert idx.match(c) == {"small": 2, "big": 5}
    assert idx.stats()["capacity"] == {"small": 2, "big": 10}


def test_capacity_zero_and_negative() -> None:
    idx = make("a", capacity=0)
    assert idx.record("a", chain(2)) != []
    assert idx.blocks("a") == 0
    with pytest.raises(ValueError):
        PrefixIndex(capacity_blocks=-1)


def test_events_stored_removed_cleared() -> None:
    idx = make("a", "b")
    c = chain(6)
    idx.stored("a", c)
    idx.stored("b", c[:3])
    idx.removed("a", [c[5], 424242])  # unknown hash ignored
    assert idx.match(c) == {"a": 5, "b": 3}
    idx.cleared("a")
    assert idx.match(c) == {"a": 0, "b": 3}
    assert idx.blocks("a") == 0
    assert idx.stats()["unique_blocks"] == 3


def test_shared_blocks_survive_one_holder_leaving() -> None:
    idx = make("a", "b")
    c = chain(4)
    idx.stored("a", c)
    idx.stored("b", c)
    idx.removed("a", c)
    assert idx.match(c) == {"a": 0, "b": 4}
    assert idx.stats()["unique_blocks"] == 4


def test_replica_lifecycle() -> None:
    idx = make("a", "b", "c")
    c = chain(4)
    for n in ("a", "b", "c"):
        idx.record(n, c)
    idx.remove_replica("b")
    assert idx.replicas == ["a", "c"]
    assert idx.match(c) == {"a": 4, "c": 4}
    idx.add_replica("d")  # reuses b's slot: must start empty
    assert idx.match(c) == {"a": 4, "c": 4, "d": 0}
    with pytest.raises(ValueError):
        idx.add_replica("a")
    with pytest.raises(KeyError):
        idx.record("zzz", c)
    idx.remove_replica("a")
    idx.remove_replica("c")
    assert idx.stats()["unique_blocks"] == 0


def test_many_replicas() -> None:
    names = [f"r{i}" for i in range(70)]  # beyond 64: masks are arbitrary-size ints
    idx = make(*names)
    c = chain(80)
    for i, n in enumerate(names):
        idx.record(n, c[:i])
    assert idx.match(c) == {n: i for i, n in enumerate(names)}


def test_correct_at_scale() -> None:
    rng = random.Random(7)
    idx = make("a", "b", "c", "d", capacity=60_000)
    shared = [rng.getrandbits(64) for _ in range(100)]
    last: dict[str, list[int]] = {}
    for n in ("a", "b", "c", "d"):
        for _ in range(120):  # ~50k blocks per replica, 200k in total
            c = shared[: rng.randint(0, 100)] + [rng.getrandbits(64) for _ in range(400)]
            idx.record(n, c)
            last[n] = c
    assert sum(idx.stats()["blocks"].values()) > 190_000
    for n, c in last.items():
        m = idx.match(c)
        assert m[n] == len(c)
        for other in m:
            if other != n:
                assert m[other] <= 100  # only the shared prefix can be elsewhere
    q = shared + [rng.getrandbits(64) for _ in range(412)]
    assert idx.match(q) == {n: 100 for n in ("a", "b", "c", "d")}


def test_concurrent_writers_and_readers() -> None:
    idx = make("a", "b", capacity=5000)
    c = chain(512)
    errors: list[BaseException] = []

    def writer(name: str, seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(200):
                idx.record(name, [rng.getrandbits(64) for _ in range(50)])
                idx.stored(name, c)
        except BaseException as e:  # pragma: no cover - surfaced below
            errors.append(e)

    def reader() -> None:
        try:
            for _ in range(500):
                m = idx.match(c)
                assert set(m) == {"a", "b"}
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [
        threading.Thread(target=writer, args=("a", 1)),
        threading.Thread(target=writer, args=("b", 2)),
        threading.Thread(target=reader),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert idx.match(c) == {"a": 512, "b": 512}


def test_forked_tells_a_shared_prefix_from_one_conversations_history() -> None:
    idx = PrefixIndex(capacity_blocks=6)
    idx.add_replica("a")
    idx.add_replica("b")
    doc, turn1, turn2 = [1, 2, 3], [1, 2, 3, 10, 11], [1, 2, 3, 10, 11, 12]
    idx.record("a", turn1)
    idx.record("a", turn2)  # the same conversation's next turn extends it the same way
    assert not any(idx.forked(h) for h in turn2)
    idx.record("a", turn1)  # recorded again: still one way on
    assert not idx.forked(3)
    idx.record("b", doc + [20])  # a second conversation continues the document differently
    assert idx.forked(3) and not idx.forked(2) and not idx.forked(11)
    idx.record("a", [30, 31, 32, 33, 34, 35])  # a's capacity (6) pushes the conversation out of a
    assert idx.forked(3)  # b still holds block 3
    idx.cleared("b")
    assert idx.match(doc) == {"a": 0, "b": 0} and not idx.forked(3)  # forgotten with the block
    idx.stored("b", [1, 2, 3, 40])
    idx.stored("b", [41], parent=3)  # precise mode: an event's blocks after a parent block
    assert idx.forked(3)
    idx.stored("b", [50], parent=99)  # a parent nobody holds is not remembered
    assert not idx.forked(99) and idx.match([99]) == {"a": 0, "b": 0}


# -- property: agrees with a brute-force model --------------------------------------------

REPLICAS = ("r0", "r1", "r2")
hashes_st = st.lists(st.integers(0, 15), max_size=8)  # tiny key space: lots of overlap
op_st = st.one_of(
    st.tuples(st.just("record"), st.sampled_from(REPLICAS), hashes_st),
    st.tuples(st.just("stored"), st.sampled_from(REPLICAS), hashes_st),
    st.tuples(st.just("removed"), st.sampled_from(REPLICAS), hashes_st),
    st.tuples(st.just("cleared"), st.sampled_from(REPLICAS), st.just([])),
    st.tuples(st.just("match"), st.just(""), hashes_st),
)


class Model:
    """Per-replica list in LRU order (front = least recent); match = walk each replica."""

    def __init__(self, caps: dict[str, int | None]) -> None:
        self.caps = caps
        self.lru: dict[str, list[int]] = {r: [] for r in caps}
        self.successors: dict[int, set[int]] = {}  # block → blocks recorded right after it

    def link(self, hs: list[int]) -> None:
        for a, b in zip(hs, hs[1:]):
            self.successors.setdefault(a, set()).add(b)

    def forget_unheld(self) -> None:
        held = set().union(*self.lru.values())
        self.successors = {h: s for h, s in self.successors.items() if h in held}

    def touch(self, r: str, hs: list[int]) -> list[int]:
        lru = self.lru[r]
        for h in reversed(hs):
            if h in lru:
                lru.remove(h)
            lru.append(h)
        cap = self.caps[r]
        evicted: list[int] = []
        while cap is not None and len(lru) > cap:
            evicted.append(lru.pop(0))
        return evicted

    def match(self, hs: list[int], touch: bool = False) -> dict[str, int]:
        out = {}
        for r, lru in self.lru.items():
            n = 0
            while n < len(hs) and hs[n] in lru:
                n += 1
            out[r] = n
            if touch:
                for h in reversed(hs[:n]):
                    lru.remove(h)
                    lru.append(h)
        return out


@settings(max_examples=300, deadline=None)
@given(st.lists(op_st, max_size=60), st.sampled_from([None, 0, 3, 6]), st.booleans(), st.sampled_from([1, 3, 256]))
def test_matches_brute_force_model(ops, cap, touch, step) -> None:
    """Whatever the record step (a chain longer than it is applied in steps, the lock let go
    between them), one thread's calls leave what one hold per call would."""
    caps = {"r0": cap, "r1": 5, "r2": 4}
    idx = PrefixIndex(capacity_blocks=cap, touch_on_match=touch, record_step=step)
    idx.add_replica("r0")  # index default
    idx.add_replica("r1", capacity_blocks=5)
    idx.add_replica("r2", capacity_blocks=4)
    model = Model(caps)
    for op, r, hs in ops:
        if op in ("record", "stored"):
            model.link(hs)
            assert getattr(idx, op)(r, hs) == model.touch(r, hs)
        elif op == "removed":
            idx.removed(r, hs)
            model.lru[r] = [h for h in model.lru[r] if h not in hs]
        elif op == "cleared":
            idx.cleared(r)
            model.lru[r] = []
        else:
            assert idx.match(hs) == model.match(hs, touch)
        for name in REPLICAS:
            assert idx.blocks(name) == len(model.lru[name])
            assert cap is None or name != "r0" or idx.blocks(name) <= cap
        model.forget_unheld()
        assert [idx.forked(h) for h in range(16)] == [len(model.successors.get(h, ())) >= 2 for h in range(16)]
    probe = list(range(16))
    assert idx.match(probe) == model.match(probe, touch)
    assert idx.stats()["unique_blocks"] == len(set().union(*model.lru.values()))


# -- property: a sharded LRU (large capacities) agrees with a per-shard brute-force model --------

POOL = [(i * 0x9E3779B97F4A7C15) % 2**64 for i in range(1, 17)]  # 16 hashes spread over the shard bits
pool_st = st.lists(st.sampled_from(POOL), max_size=8)
sharded_op_st = st.one_of(
    st.tuples(st.just("record"), st.sampled_from(REPLICAS), pool_st),
    st.tuples(st.just("removed"), st.sampled_from(REPLICAS), pool_st),
    st.tuples(st.just("match"), st.just(""), pool_st),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(sharded_op_st, max_size=60), st.sampled_from([4, 6, 9]), st.sampled_from([1, 2, 256]))
def test_sharded_lru_matches_a_per_shard_model(ops, cap, step) -> None:
    """With LRU_SHARD_BLOCKS = 2, a capacity of 4..9 is 2 or 4 shards: each keeps exact LRU order
    within its share of the capacity, the holder table stays exact, and match stops at the first
    miss even where a shard evicted a chain's block another shard still follows; records applied
    in steps (and their evictions, a step at a time) give the same evictions in the same order."""
    import kvgate.index.kv.prefix_replica as replica

    saved, replica.LRU_SHARD_BLOCKS = replica.LRU_SHARD_BLOCKS, 2
    try:
        k = replica.lru_shards(cap)
        idx = PrefixIndex(capacity_blocks=cap, record_step=step)
        for r in REPLICAS:
            idx.add_replica(r)
    finally:
        replica.LRU_SHARD_BLOCKS = saved
    assert k in (2, 4)
    shard_caps = [cap // k + (i < cap % k) for i in range(k)]
    model = {r: [[] for _ in range(k)] for r in REPLICAS}  # per replica, per shard, LRU order
    of = lambda h: (h >> 6) & (k - 1)  # noqa: E731
    for op, r, hs in ops:
        if op == "record":
            for h in reversed(hs):
                lru = model[r][of(h)]
                if h in lru:
                    lru.remove(h)
                lru.append(h)
            evicted = []
            for lru, c in zip(model[r], shard_caps):
                while len(lru) > c:
                    evicted.append(lru.pop(0))
            assert idx.record(r, hs) == evicted
        elif op == "removed":
            idx.removed(r, hs)
            model[r] = [[h for h in lru if h not in hs] for lru in model[r]]
        else:
            held = {name: set().union(*map(set, shards)) for name, shards in model.items()}
            expect = {}
            for name in REPLICAS:
                n = 0
                while n < len(hs) and hs[n] in held[name]:
                    n += 1
                expect[name] = n
            assert idx.match(hs) == expect
        for name in REPLICAS:
            assert idx.blocks(name) == sum(map(len, model[name])) <= cap
    assert idx.stats()["unique_blocks"] == len(set().union(*(set().union(*map(set, s)) for s in model.values())))
