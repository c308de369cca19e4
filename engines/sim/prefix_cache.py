"""PrefixCache: the simulated replica's KV prefix cache, an LRU set of chained block hashes.

- lookup (`match`): the number of LEADING blocks of the prompt present, stopping at the first
  miss (chained hashes make that the longest cached token prefix).
- insert: the prompt's full blocks (at most capacity of them) are touched from the LAST to the
  FIRST, so a chain's leading blocks are the most recently used and pressure evicts tails first
  (vLLM frees a request's blocks in reverse order for the same reason); then LRU blocks beyond
  capacity are evicted. Blocks in use by running requests may be evicted (a real engine pins
  them; the difference only matters when a single batch nearly fills the cache).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from kvgate.index.kv.hashing import BlockHash


class PrefixCache:
    """LRU set of block hashes with a fixed capacity in blocks.

    Invariants: len(self) <= capacity_blocks; iteration order is least → most recently used.
    """

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[BlockHash, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block: object) -> bool:
        return block in self._lru

    def hashes(self) -> list[BlockHash]:
        """Held blocks, least recently used first."""
        return list(self._lru)

    def match(self, hashes: Sequence[BlockHash]) -> int:
        """Number of leading `hashes` held (stops at the first miss); changes nothing."""
        n = 0
        for h in hashes:
            if h not in self._lru:
                break
            n += 1
        return n

    def insert(self, hashes: Sequence[BlockHash]) -> tuple[list[int], list[BlockHash]]:
        """Touch/insert the first capacity_blocks of `hashes`, last to first (so hashes[0] ends
        most recently used), then evict beyond capacity.

        Returns (indices into `hashes` of newly stored blocks, ascending; evicted hashes, LRU
        first). Evicted blocks are never among those just inserted or touched."""
        keep = list(hashes[: self.capacity_blocks])
        new: list[int] = []
        for i in range(len(keep) - 1, -1, -1):
            h = keep[i]
            if h in self._lru:
                self._lru.move_to_end(h)
            else:
                self._lru[h] = None
                new.append(i)
        evicted: list[BlockHash] = []
        while len(self._lru) > self.capacity_blocks:
            evicted.append(self._lru.popitem(last=False)[0])
        new.reverse()
        return new, evicted

    def clear(self) -> list[BlockHash]:
        """Drop every block; returns what was held."""
        held = list(self._lru)
        self._lru.clear()
        return held


def consecutive_runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending indices → inclusive (first, last) runs of consecutive values, in order
    (e.g. [0, 1, 2, 5, 6] → [(0, 2), (5, 6)]; each run is one BlockStored event)."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs
