"""The prefix index's per-block loops: the C extension gives what the Python loops give, call for
call on the same tables and over random sequences of index operations; it is built wherever a C
compiler is; bad arguments raise, never crash."""

from __future__ import annotations

import random
import shutil
import sysconfig
from collections import OrderedDict
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.index.kv.prefix import PrefixIndex
from kvgate.index.kv.prefix_loops import HOLDER_SHARDS, loops, python_loops

PY = python_loops()
FORKED = object()


def compiler() -> str | None:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc)


@pytest.fixture(scope="module")
def native() -> ModuleType:
    mod = loops()
    if mod is PY:
        if compiler() is not None:
            pytest.fail("a C compiler is here but kvgate.index.kv._prefix_loops was not built: run make install")
        pytest.skip("no C compiler: the Python loops are the only ones")
    return mod


def test_the_extension_is_built_where_a_compiler_is() -> None:
    if compiler() is None:
        pytest.skip("no C compiler here")
    assert loops() is not PY
    assert loops().HOLDER_SHARDS == HOLDER_SHARDS


def tables(seed: int, n_shards: int) -> tuple[list[dict[int, int]], list[OrderedDict[int, None]], list[dict[int, Any]]]:
    """Holders, one replica's LRU shards and successors, partly filled the same way for a seed."""
    rng = random.Random(seed)
    holders: list[dict[int, int]] = [{} for _ in range(HOLDER_SHARDS)]
    shards: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n_shards)]
    successors: list[dict[int, Any]] = [{} for _ in range(HOLDER_SHARDS)]
    for _ in range(200):
        h = rng.getrandbits(64)
        holders[h & 63][h] = rng.choice([1, 2, 3, 5, 1 << 70 | 1])
        shards[(h >> 6) & (n_shards - 1)][h] = None
        successors[h & 63][h] = rng.choice([FORKED, rng.getrandbits(64)])
    return holders, shards, successors


def snapshot(t: tuple[Any, ...]) -> tuple[Any, ...]:
    holders, shards, successors = t
    return (
        [dict(d) for d in holders],
        [list(s) for s in shards],  # the LRU order
        [{k: ("F" if v is FORKED else v) for k, v in d.items()} for d in successors],
    )


def a_chain(rng: random.Random, known: list[int], n: int) -> list[int]:
    """Hashes a chain might hold: some already in the tables, some new."""
    return [rng.choice(known) if known and rng.random() < 0.5 else rng.getrandbits(64) for _ in range(n)]


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("n_shards", [1, 4])
def test_each_loop_changes_the_tables_as_the_python_one(native: ModuleType, seed: int, n_shards: int) -> None:
    rng = random.Random(seed)
    a, b = tables(seed, n_shards), tables(seed, n_shards)
    known = [h for d in a[0] for h in d]
    for _ in range(10):
        chain = a_chain(rng, known, rng.randrange(0, 40))
        bit = rng.choice([1, 4, 1 << 65])
        assert PY.insert(a[0], a[1], bit, chain) == native.insert(b[0], b[1], bit, tuple(chain))
        PY.link(a[2], chain, FORKED)
        native.link(b[2], chain, FORKED)
        active = rng.choice([1, 3, 7, (1 << 70) | 1, 0])
        start = rng.randrange(0, len(chain) + 1)
        assert PY.walk(a[0], chain, start, active) == native.walk(b[0], chain, start, active)
        held = [h for h in chain if h in b[1][(h >> 6) & (n_shards - 1)]]
        n = rng.randrange(0, len(held) + 1)
        PY.touch(a[1], held, n)
        native.touch(b[1], held, n)
        slot = rng.randrange(n_shards)
        over = min(rng.randrange(0, 6), len(a[1][slot]))
        keep = ~rng.choice([1, 4, 1 << 65, 1 << 70])
        assert PY.evict(a[0], a[2], a[1][slot], over, keep) == native.evict(b[0], b[2], b[1][slot], over, keep)
        gone = [h for h in chain if rng.random() < 0.3] + [rng.getrandbits(64)]  # one never held
        PY.remove(a[0], a[2], a[1], gone, keep)
        native.remove(b[0], b[2], b[1], iter(gone), keep)
        assert snapshot(a) == snapshot(b)


def test_walk_reports_the_first_change_and_who_is_left(native: ModuleType) -> None:
    for mod in (PY, native):
        holders: list[dict[int, int]] = [{} for _ in range(HOLDER_SHARDS)]
        for h, mask in ((10, 0b11), (11, 0b11), (12, 0b01), (13, 0b01)):
            holders[h & 63][h] = mask
        assert mod.walk(holders, [10, 11, 12, 13, 14], 0, 0b11) == (2, 0b01)
        assert mod.walk(holders, [10, 11, 12, 13, 14], 3, 0b01) == (4, 0)
        assert mod.walk(holders, [10, 11], 0, 0b11) == (2, 0b11)
        assert mod.walk(holders, [], 0, 0b11) == (0, 0b11)


def test_bad_arguments_raise(native: ModuleType) -> None:
    holders: list[dict[int, int]] = [{} for _ in range(HOLDER_SHARDS)]
    shards: list[OrderedDict[int, None]] = [OrderedDict()]
    with pytest.raises(TypeError):
        native.insert(holders, shards, 1, ["not a hash"])
    with pytest.raises(TypeError):
        native.insert(holders[:3], shards, 1, [1])
    with pytest.raises(ValueError):
        native.insert(holders, [OrderedDict() for _ in range(3)], 1, [1])
    with pytest.raises(TypeError):
        native.walk(holders, [1], 0, "everyone")
    with pytest.raises(TypeError):
        native.link(holders, 5, FORKED)
    with pytest.raises(IndexError):
        native.touch(shards, [1], 2)
    with pytest.raises(TypeError):
        native.insert(holders, shards, 1)  # type: ignore[call-arg]
    with pytest.raises(KeyError):  # nothing left to evict
        native.evict(holders, holders, OrderedDict(), 1, ~1)
    with pytest.raises(KeyError):  # an LRU entry with no holder entry breaks the tables' invariant
        native.evict(holders, holders, OrderedDict([(5, None)]), 1, ~1)
    with pytest.raises(TypeError):
        native.evict(holders, holders, OrderedDict([(5, None)]), 1, "everyone")
    with pytest.raises(TypeError):
        native.evict(holders[:3], holders, OrderedDict([(5, None)]), 1, ~1)


def test_evict_pops_the_oldest_and_drops_a_block_with_its_last_holder(native: ModuleType) -> None:
    for mod in (PY, native):
        holders: list[dict[int, int]] = [{} for _ in range(HOLDER_SHARDS)]
        successors: list[dict[int, Any]] = [{} for _ in range(HOLDER_SHARDS)]
        lru: OrderedDict[int, None] = OrderedDict.fromkeys([7, 8, 9])
        for h, mask in ((7, 0b01), (8, 0b11), (9, 0b01)):
            holders[h & 63][h] = mask
            successors[h & 63][h] = h + 1
        assert mod.evict(holders, successors, lru, 2, ~0b01) == [7, 8]
        assert list(lru) == [9]
        assert 7 not in holders[7] and 7 not in successors[7]  # its last holder went
        assert holders[8][8] == 0b10 and successors[8][8] == 9  # another replica still holds it
        assert mod.evict(holders, successors, lru, 0, ~0b01) == []


OPS = st.lists(
    st.tuples(
        st.sampled_from(["record", "stored", "removed", "match", "cleared"]),
        st.integers(0, 2),  # replica
        st.integers(0, 5),  # chain family
        st.integers(0, 30),  # length
        st.integers(0, 10),  # cut
    ),
    max_size=60,
)


def indexes(capacity: int | None, touch: bool, native: ModuleType) -> tuple[PrefixIndex, PrefixIndex]:
    out = []
    for mod in (PY, native):
        idx = PrefixIndex(capacity, touch_on_match=touch, chain_loops=mod)
        for name in ("r0", "r1", "r2"):
            idx.add_replica(name)
        out.append(idx)
    return out[0], out[1]


@settings(max_examples=60, deadline=None)
@given(ops=OPS, capacity=st.sampled_from([None, 12, 40, 4 * 8192]), touch=st.booleans())
def test_an_index_on_either_loops_answers_the_same(
    native: ModuleType, ops: list[Any], capacity: Any, touch: bool
) -> None:
    a, b = indexes(capacity, touch, native)
    # chain families share a head and part ways; 64-bit hashes spread over every shard
    rng = random.Random(7)
    heads = [rng.getrandbits(64) for _ in range(8)]
    families = [heads[: f % 3 + 2] + [rng.getrandbits(64) for _ in range(40)] for f in range(6)]
    for op, r, f, n, cut in ops:
        name, chain = f"r{r}", families[f][:n]
        if op == "record":
            assert a.record(name, chain) == b.record(name, chain)
        elif op == "stored":
            parent = chain[cut - 1] if 0 < cut <= len(chain) else None
            rest = chain[cut:] if parent is not None else chain
            assert a.stored(name, rest, parent) == b.stored(name, rest, parent)
        elif op == "removed":
            a.removed(name, chain[cut:])
            b.removed(name, chain[cut:])
        elif op == "cleared":
            a.cleared(name)
            b.cleared(name)
        assert a.match(chain) == b.match(chain)
        assert a.stats() == b.stats()
        assert [a.forked(h) for h in chain] == [b.forked(h) for h in chain]


def test_a_router_on_the_python_loops_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from kvgate.middleware.config import ReplicaConfig, RoutingConfig
    from kvgate.middleware.routing.router import Router

    reps = [ReplicaConfig(name="a", api_base="http://a/v1")]
    with caplog.at_level(logging.WARNING, logger="kvgate.router"):
        Router(reps, RoutingConfig(), index=PrefixIndex(chain_loops=PY), name="slow").close()
        said = [r.getMessage() for r in caplog.records if "they run in Python" in r.getMessage()]
        assert len(said) == 1 and "route slow" in said[0] and "_prefix_loops" in said[0]
        caplog.clear()
        if loops() is not PY:
            Router(reps, RoutingConfig(), name="fast").close()
            assert not [r for r in caplog.records if "_prefix_loops" in r.getMessage()]
