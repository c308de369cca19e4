"""The prefix index's per-block loops: the C extension gives what the Python loops give over random
sequences of index operations (call for call: tests/test_prefix_tables.py); it is built wherever
a C compiler is; bad arguments raise, never crash."""

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


# The loops' call-for-call parity over random tables (dicts, and the C module's own) is in
# tests/test_prefix_tables.py.


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
