"""One replica's side of the prefix index (kvgate.index.kv.prefix): its bit in the holder masks,
its capacity in blocks, and its LRU, split into shards when the capacity is large (the prefix
index's docstring says why, and what order that keeps).

May import: kvgate.index.kv.hashing (the BlockHash type).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from kvgate.index.kv.hashing import BlockHash

LRU_SHARD_BLOCKS = 8192  # a replica's LRU is split into shards of about this many blocks


def check_capacity(cap: int | None) -> None:
    """A replica's bound in blocks: None (unbounded) or at least 0."""
    if cap is not None and cap < 0:
        raise ValueError("capacity_blocks must be >= 0 or None")


def lru_shards(capacity: int | None) -> int:
    """How many LRU shards a replica of this capacity gets: the largest power of two k with
    k × LRU_SHARD_BLOCKS ≤ capacity (1 when unbounded or smaller: the exact LRU order)."""
    if capacity is None:
        return 1
    k = 1
    while 2 * k * LRU_SHARD_BLOCKS <= capacity:
        k *= 2
    return k


@dataclass
class Replica:
    name: str
    bit: int  # 1 << slot
    capacity: int | None
    # LRU order per shard: first = least recently used. An ordered set: an OrderedDict whose values
    # are unused, or the C module's U64Lru (kvgate.index.kv.prefix_tables)
    shards: list[Any] = field(default_factory=list)
    caps: list[int | None] = field(default_factory=list)  # each shard's share of the capacity
    evictions: int = 0
    new_lru: Callable[[], Any] = OrderedDict  # makes an empty shard

    def __post_init__(self) -> None:
        self.bound(self.capacity)

    def bound(self, cap: int | None) -> None:
        """Empty shards laid out for capacity `cap` (the caller moves any blocks over)."""
        k = lru_shards(cap)
        self.capacity = cap
        self.shards = [self.new_lru() for _ in range(k)]
        self.caps = [None] * k if cap is None else [cap // k + (i < cap % k) for i in range(k)]

    def shard(self, h: BlockHash) -> Any:
        # bits 6.. of the hash: independent of the holder shard (bits 0-5)
        return self.shards[(h >> 6) & (len(self.shards) - 1)]

    def __len__(self) -> int:
        return sum(len(s) for s in self.shards)

    def __contains__(self, h: BlockHash) -> bool:
        return h in self.shard(h)
