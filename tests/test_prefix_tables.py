"""The prefix index's native tables (U64Map, U64Lru in kvgate.index.kv._prefix_loops): each reads
and changes like the dict or OrderedDict it stands in for, through growth and shrinking; the C
loops over them, and over dicts, leave what the Python loops leave over dicts, call for call; an index past 64 replicas moves to
dicts with nothing lost; bad input raises, never crashes."""

from __future__ import annotations

import random
from collections import OrderedDict
from types import ModuleType
from typing import Any

import pytest

from kvgate.index.kv.prefix import PrefixIndex
from kvgate.index.kv.prefix_loops import loops, python_loops
from kvgate.index.kv.prefix_tables import new_tables

PY = python_loops()
FORKED = object()


@pytest.fixture(scope="module")
def native() -> ModuleType:
    mod = loops()
    if mod is PY:  # tests/test_prefix_loops.py fails where a compiler is and the module is not
        pytest.skip("the C loops were not built")
    return mod


def keys(rng: random.Random, n: int) -> list[int]:
    """Hashes sharing their low 12 bits, as a holder shard's and an LRU shard's do."""
    return [rng.getrandbits(52) << 12 | 0xABC for _ in range(n)] + [0, (1 << 64) - 1]


@pytest.mark.parametrize("seed", range(4))
def test_a_map_reads_and_changes_like_a_dict(native: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    pool = keys(rng, 3000)
    m, d = native.U64Map(FORKED), {}
    for step in range(40_000):
        k = rng.choice(pool)
        op = rng.random()
        # fill, then empty, then fill: the table grows and shrinks
        filling = (step // 10_000) % 2 == 0
        if op < (0.5 if filling else 0.2):
            v = FORKED if rng.random() < 0.1 else rng.getrandbits(64)
            m[k], d[k] = v, v
        elif op < 0.8:
            assert m.pop(k, None) == d.pop(k, None)
        else:
            assert (k in m) == (k in d)
            got, want = m.get(k), d.get(k)
            assert got is want if want is FORKED or want is None else got == want
        if step % 5000 == 0:
            assert dict(m.items()) == d and sorted(m) == sorted(d) and len(m) == len(d)
    assert dict(m.items()) == d
    for k in list(d):
        del m[k]
    assert len(m) == 0 and list(m) == []


def test_a_map_says_what_it_cannot_hold(native: ModuleType) -> None:
    m = native.U64Map()
    assert "x" not in m and -1 not in m and 1 << 64 not in m and m.get("x", 7) == 7
    with pytest.raises(KeyError):
        m[5]
    with pytest.raises(KeyError):
        del m[5]
    with pytest.raises(KeyError):
        m.pop(5)
    with pytest.raises(OverflowError):
        m[-1] = 1
    with pytest.raises(OverflowError):
        m[1] = 1 << 64
    with pytest.raises(TypeError):
        m["x"] = 1
    with pytest.raises(TypeError):
        m[1] = FORKED  # not this map's marker
    assert len(m) == 0


@pytest.mark.parametrize("seed", range(4))
def test_an_lru_keeps_an_ordered_dicts_order(native: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    pool = keys(rng, 2000)
    lru, od = native.U64Lru(), OrderedDict()
    for step in range(40_000):
        k = rng.choice(pool)
        op = rng.random()
        filling = (step // 10_000) % 2 == 0
        if op < (0.4 if filling else 0.1):
            lru[k], od[k] = None, None  # a present key keeps its place
        elif op < 0.6:
            if k in od:
                lru.move_to_end(k)
                od.move_to_end(k)
        elif op < 0.75:
            if k in od:
                del lru[k]
                del od[k]
        elif od:
            last = rng.random() < 0.3
            assert lru.popitem(last=last) == od.popitem(last=last)
        if step % 2000 == 0:
            assert list(lru) == list(od) and len(lru) == len(od)
    assert list(lru) == list(od)


def test_an_lru_says_what_it_cannot_do(native: ModuleType) -> None:
    lru = native.U64Lru()
    with pytest.raises(KeyError):
        lru.popitem()
    with pytest.raises(KeyError):
        lru.move_to_end(3)
    with pytest.raises(TypeError):
        lru[3] = 1  # an ordered set
    with pytest.raises(ValueError):
        lru[3] = None
        lru.move_to_end(3, last=False)
    with pytest.raises(OverflowError):
        lru[-3] = None
    assert list(lru) == [3] and lru[3] is None and "x" not in lru


def tables(mod: ModuleType, seed: int, n_shards: int, top: int) -> tuple[list[Any], list[Any], list[Any]]:
    """Holders, one replica's LRU shards and successors, as an index on `mod`'s loops makes them
    (the C module's own tables, or dicts), partly filled the same way for a seed; `top`: the
    widest bit a mask has."""
    holders, successors, new_lru = new_tables(mod, FORKED)
    shards = [new_lru() for _ in range(n_shards)]
    rng = random.Random(seed)
    for _ in range(200):
        h = rng.getrandbits(64)
        holders[h & 63][h] = rng.choice([1, 2, 3, 5, top | 1])
        shards[(h >> 6) & (n_shards - 1)][h] = None
        successors[h & 63][h] = rng.choice([FORKED, rng.getrandbits(64)])
    return holders, shards, successors


def snapshot(t: tuple[Any, ...]) -> tuple[Any, ...]:
    holders, shards, successors = t
    return (
        [dict(d.items()) for d in holders],
        [list(s) for s in shards],
        [{k: ("F" if v is FORKED else v) for k, v in d.items()} for d in successors],
    )


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("n_shards", [1, 4])
@pytest.mark.parametrize(("kind", "walker"), [("dicts", "c"), ("native", "c"), ("native", "python")])
def test_each_loop_leaves_what_the_python_loops_leave_over_dicts(
    native: ModuleType, seed: int, n_shards: int, kind: str, walker: str
) -> None:
    """Dicts take masks of any width; the native tables 64 bits. The Python loops also run on the
    native tables, which read like dicts."""
    top = 1 << 70 if kind == "dicts" else 1 << 63
    rng = random.Random(seed)
    a, b = tables(PY, seed, n_shards, top), tables(native if kind == "native" else PY, seed, n_shards, top)
    mod = native if walker == "c" else PY
    known = [h for d in a[0] for h in d]
    for _ in range(12):
        chain = [rng.choice(known) if rng.random() < 0.5 else rng.getrandbits(64) for _ in range(rng.randrange(40))]
        bit = rng.choice([1, 4, top])
        assert PY.insert(a[0], a[1], bit, chain) == mod.insert(b[0], b[1], bit, tuple(chain))
        PY.link(a[2], chain, FORKED)
        mod.link(b[2], chain, FORKED)
        active = rng.choice([1, 3, 7, top | 1, 0])
        start = rng.randrange(0, len(chain) + 1)
        assert PY.walk(a[0], chain, start, active) == mod.walk(b[0], chain, start, active)
        held = [h for h in chain if h in a[1][(h >> 6) & (n_shards - 1)]]
        n = rng.randrange(0, len(held) + 1)
        PY.touch(a[1], held, n)
        mod.touch(b[1], held, n)
        slot = rng.randrange(n_shards)
        over = min(rng.randrange(0, 6), len(a[1][slot]))
        keep = ~rng.choice([1, 4, top])
        assert PY.evict(a[0], a[2], a[1][slot], over, keep) == mod.evict(b[0], b[2], b[1][slot], over, keep)
        gone = [h for h in chain if rng.random() < 0.3] + [rng.getrandbits(64)]  # one never held
        PY.remove(a[0], a[2], a[1], gone, keep)
        mod.remove(b[0], b[2], b[1], iter(gone), keep)
        assert snapshot(a) == snapshot(b)


def test_the_c_loops_refuse_what_native_tables_cannot_hold(native: ModuleType) -> None:
    holders, successors, new_lru = new_tables(native, FORKED)
    shards = [new_lru()]
    assert type(holders[0]) is native.U64Map and type(shards[0]) is native.U64Lru
    with pytest.raises(OverflowError):  # a 65th replica's bit: the index widens before this
        native.insert(holders, shards, 1 << 64, [1])
    with pytest.raises(TypeError):  # native holders, an OrderedDict shard
        native.insert(holders, [OrderedDict()], 1, [1])
    with pytest.raises(TypeError):
        native.insert(holders[:63] + [{}], shards, 1, [1])
    with pytest.raises(ValueError):  # made with another marker
        native.link(successors, [1, 2], object())
    with pytest.raises(KeyError):  # nothing left to evict
        native.evict(holders, successors, shards[0], 1, ~1)
    shards[0][5] = None
    with pytest.raises(KeyError):  # an LRU entry with no holder entry breaks the tables' invariant
        native.evict(holders, successors, shards[0], 1, ~1)
    with pytest.raises(KeyError):
        native.touch(shards, [6], 1)
    with pytest.raises(TypeError):
        native.walk(holders, ["x"], 0, 1)
    shards[0][5] = None  # the evict above popped it before it raised
    with pytest.raises(KeyError):  # held in the LRU, unknown to the holder table
        native.remove(holders, successors, shards, [5], ~1)
    with pytest.raises(TypeError):
        native.remove(holders, successors, shards, ["x"], ~1)
    native.remove(holders, successors, shards, [-1, 1 << 64, 7], ~1)  # never held: nothing to do


def test_an_index_past_64_replicas_moves_to_dicts_with_nothing_lost(native: ModuleType) -> None:
    rng = random.Random(3)
    heads = [rng.getrandbits(64) for _ in range(4)]
    chains = [heads[: i % 3 + 1] + [rng.getrandbits(64) for _ in range(30)] for i in range(12)]
    a, b = PrefixIndex(40, chain_loops=PY), PrefixIndex(40, chain_loops=native)
    for idx in (a, b):
        for r in range(60):
            idx.add_replica(f"r{r}")
    for i, c in enumerate(chains):
        assert a.record(f"r{i % 5}", c) == b.record(f"r{i % 5}", c)
    for r in range(60, 80):  # widening happens at the 65th
        a.add_replica(f"r{r}")
        b.add_replica(f"r{r}")
        ca = rng.choice(chains)
        assert a.record(f"r{r}", ca) == b.record(f"r{r}", ca)
    for i, c in enumerate(chains):  # evictions in the same order as before the move
        assert a.record(f"r{i % 7}", c[::-1]) == b.record(f"r{i % 7}", c[::-1])
        assert a.match(c) == b.match(c)
        assert [a.forked(h) for h in c] == [b.forked(h) for h in c]
    assert a.stats() == b.stats()
    assert b.native_loops
    b.removed("r70", chains[0])
    a.removed("r70", chains[0])
    assert a.stats() == b.stats()
