"""The prefix index's loops over one chain of block hashes, as functions over its tables.

`PrefixIndex` (kvgate.index.kv.prefix) owns the tables and the lock; these functions only walk a
chain through them, under that lock. They run once or twice per routed request over every block
of the prompt (and `evict` over every block a record pushes out), so they exist twice: here in
Python, and in `_prefix_loops.c`, a C extension with the same names and contracts that `pip
install` builds where a C compiler is found (setup.py; the build is optional and a failed one
leaves this module in use). `unset`, one block's step, is Python's only. `loops()` gives the C one when it
is importable. tests/test_prefix_loops.py (over dicts) and tests/test_prefix_tables.py (over the C
module's tables) hold both to the same results, call for call and over random sequences of index
operations.

The tables, as PrefixIndex keeps them:
- `holders`: HOLDER_SHARDS dicts, hash → int bitmask of the replicas holding it, picked by
  `h & (HOLDER_SHARDS - 1)`; a hash held by nobody is absent;
- `successors`: the same sharding, hash → the one hash recorded after it, or `forked` once two
  different ones were;
- `shards`: one replica's LRU as a power of two of OrderedDicts (first = least recently used),
  picked by `(h >> 6) & (len(shards) - 1)`.
With the C loops these are the C module's own tables, which read like those (kvgate.index.kv.
prefix_tables). `tally` counts in one more table, BlockCounts' (kvgate.index.kv.block_counts):
hash → count, a U64Map for the C loops.

May import: kvgate.index.kv.native (which of the twins runs); the C module nothing.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from types import ModuleType
from typing import Any, Iterable, Sequence

from kvgate.index.kv.native import twin

HOLDER_SHARDS = 64  # the C module hard-codes the same count: kvgate.index.kv.prefix re-exports this one


def insert(
    holders: list[dict[int, int]], shards: list[OrderedDict[int, None]], bit: int, hashes: Sequence[int]
) -> set[int]:
    """Insert or touch `hashes` in one replica's LRU, from the LAST to the FIRST (so the chain's
    first block ends most recently used), setting `bit` in a new block's holder mask. Returns the
    LRU shards that gained a block (only those can be over their capacity now)."""
    smask, hmask = len(shards) - 1, HOLDER_SHARDS - 1
    grown = set()
    for k in range(len(hashes) - 1, -1, -1):
        h = hashes[k]
        slot = (h >> 6) & smask
        lru = shards[slot]
        if h in lru:
            lru.move_to_end(h)
        else:
            lru[h] = None
            grown.add(slot)
            table = holders[h & hmask]
            table[h] = table.get(h, 0) | bit
    return grown


def link(successors: list[dict[int, Any]], hashes: Sequence[int], forked: object) -> None:
    """Note each hash's successor in this chain; a second, different one makes it `forked`."""
    hmask = HOLDER_SHARDS - 1
    for k in range(1, len(hashes)):
        prev, h = hashes[k - 1], hashes[k]
        table = successors[prev & hmask]
        seen = table.get(prev)
        if seen is None:
            table[prev] = h
        elif seen is not forked and seen != h:
            table[prev] = forked


def walk(holders: list[dict[int, int]], hashes: Sequence[int], start: int, active: int) -> tuple[int, int]:
    """From `start`, the first index i whose holders do not include every bit of `active`, with
    the bits of `active` that do hold hashes[i]: (i, held & active). (len(hashes), active) when
    every hash from `start` on is held by all of `active`."""
    hmask = HOLDER_SHARDS - 1
    for i in range(start, len(hashes)):
        h = hashes[i]
        still = holders[h & hmask].get(h, 0) & active
        if still != active:
            return i, still
    return len(hashes), active


def evict(
    holders: list[dict[int, int]], successors: list[dict[int, Any]], lru: OrderedDict[int, None], over: int, keep: int
) -> list[int]:
    """Pop the `over` least recently used hashes of one LRU shard, clearing the bits outside
    `keep` from each one's holder mask; a hash left with no holder leaves `holders` and
    `successors`. Returns the popped hashes, oldest first (each must be in `holders`)."""
    out = []
    for _ in range(over):
        h, _ = lru.popitem(last=False)
        unset(holders, successors, h, keep)
        out.append(h)
    return out


def remove(
    holders: list[dict[int, int]],
    successors: list[dict[int, Any]],
    shards: list[OrderedDict[int, None]],
    hashes: Iterable[int],
    keep: int,
) -> None:
    """Take `hashes` out of one replica's LRU shards, clearing the bits outside `keep` from each
    one's holder mask (a hash left with no holder leaves `holders` and `successors`); a hash not
    in the LRU is skipped."""
    smask = len(shards) - 1
    for h in hashes:
        lru = shards[(h >> 6) & smask]
        if h in lru:
            del lru[h]
            unset(holders, successors, h, keep)


def unset(holders: list[dict[int, int]], successors: list[dict[int, Any]], h: int, keep: int) -> None:
    """Clear the bits outside `keep` from h's holder mask (h must be in `holders`); h leaves
    `holders` and `successors` when no holder is left."""
    table = holders[h & (HOLDER_SHARDS - 1)]
    mask = table[h] & keep
    if mask:
        table[h] = mask
    else:
        del table[h]
        successors[h & (HOLDER_SHARDS - 1)].pop(h, None)


def touch(shards: list[OrderedDict[int, None]], hashes: Sequence[int], n: int) -> None:
    """Mark the first `n` hashes most recently used in one replica's LRU, last to first (every
    one of them must be in it)."""
    smask = len(shards) - 1
    for i in range(n - 1, -1, -1):
        h = hashes[i]
        shards[(h >> 6) & smask].move_to_end(h)


def tally(counts: Any, hashes: Sequence[int], up: bool) -> list[int]:
    """Count each of `hashes` once more (`up`) or once less in `counts` (hash → count, absent =
    0). Counting down drops a hash whose count reaches 0 and returns the dropped ones in order; a
    hash counted down that has no count is skipped."""
    if up:
        for h in hashes:
            counts[h] = counts.get(h, 0) + 1
        return []
    gone = []
    for h in hashes:
        n = counts.get(h)
        if n is None:
            continue
        if n > 1:
            counts[h] = n - 1
        else:
            del counts[h]
            gone.append(h)
    return gone


def python_loops() -> ModuleType:
    """This module: the loops in Python."""
    return sys.modules[__name__]


def loops() -> ModuleType:
    """The C loops when the extension was built, else the Python ones."""
    return twin("kvgate.index.kv._prefix_loops", __name__)
