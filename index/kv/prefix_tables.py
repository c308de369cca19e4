"""The prefix index's tables (kvgate.index.kv.prefix), made for the loops that walk them
(kvgate.index.kv.prefix_loops).

Where the C loops are built, an index keeps its blocks in the C module's own tables: `U64Map`
(hash → holder mask, and hash → successor or the `forked` marker) and `U64Lru` (one LRU shard, an
ordered set), which hold the 64-bit hashes inline, so a block's step is a probe into plain memory
rather than a dict's index, its entry and the key object it points to. Masks there have 64 bits:
the index whose replicas outnumber them moves to dicts and OrderedDicts (`widened`), which both
the C and the Python loops walk, as does an index on the Python loops. From Python each native
table reads like the dict or OrderedDict it stands in for, so the rest of the index does not ask
which it has.

May import: kvgate.index.kv.prefix_loops (the shard count), kvgate.index.kv.prefix_replica (the
replica whose LRU shards are converted).
"""

from __future__ import annotations

from collections import OrderedDict
from types import ModuleType
from typing import Any, Callable, Iterable

from kvgate.index.kv.prefix_loops import HOLDER_SHARDS
from kvgate.index.kv.prefix_replica import Replica

NATIVE_MASK_BITS = 64  # replicas an index on native tables can tell apart (one bit each)

Tables = tuple[list[Any], list[Any], Callable[[], Any]]  # holders, successors, a new LRU shard


def new_tables(chain_loops: ModuleType, forked: object) -> Tables:
    """Empty holder and successor tables and the LRU shard type: the C module's own when the
    loops are C, else dicts and OrderedDicts. `forked`: what a forked block's successor reads as."""
    native_map, native_lru = getattr(chain_loops, "U64Map", None), getattr(chain_loops, "U64Lru", None)
    if native_map is None or native_lru is None:
        return [{} for _ in range(HOLDER_SHARDS)], [{} for _ in range(HOLDER_SHARDS)], OrderedDict
    return [native_map() for _ in range(HOLDER_SHARDS)], [native_map(forked) for _ in range(HOLDER_SHARDS)], native_lru


def widened(holders: list[Any], successors: list[Any], replicas: Iterable[Replica]) -> Tables:
    """The same tables as dicts and OrderedDicts (each LRU shard's order kept; the replicas' shards
    are replaced in place), for masks wider than NATIVE_MASK_BITS. Tables that are dicts already
    come back as they are."""
    if all(type(t) is dict for t in holders):
        return holders, successors, OrderedDict
    for rep in replicas:
        rep.shards = [OrderedDict.fromkeys(lru) for lru in rep.shards]
        rep.new_lru = OrderedDict
    return [dict(t.items()) for t in holders], [dict(t.items()) for t in successors], OrderedDict
