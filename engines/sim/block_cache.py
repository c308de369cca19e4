"""BlockCache: the batched simulator's KV prefix cache, block by block, with pinning and
leaf-first LRU eviction (the batched model of `engines/sim/batched.py`).

Blocks are chained hashes (kvgate.index.kv.hashing): block i of a prompt has block i-1 as its parent, so
the cached blocks form a forest (a radix tree over blocks, as in SGLang's RadixCache; vLLM's
free-block queue behaves alike because it frees a request's blocks tail first).

- A running request PINS the blocks of its prompt it has matched or computed (reference count);
  a pinned block is never evicted. A request pins a whole prefix of its chain, so a pinned
  block's ancestors are pinned too: the unpinned blocks are closed under "descendant of", and
  all of them can be evicted leaf by leaf.
- Eviction takes the least recently used UNPINNED LEAF (a block no cached block has as parent),
  so a chain loses its tail before its head and a head is never orphaned. "Used" = matched,
  stored, or released by a request (a monotonic stamp).
- Capacity counts blocks. `store` makes room by eviction; when every block is pinned it may go
  past capacity (`force`: the engine lets the oldest request progress rather than deadlock; a
  real engine would preempt), and the next evictions bring it back.

Invariants: every held block's parent is held or is None; a block's `children` counts its held
children; `pinned_blocks` counts blocks with refs > 0; len(self) <= capacity_blocks except
while pinned blocks alone exceed it.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Sequence

from kvgate.index.kv.hashing import BlockHash


@dataclass
class _Block:
    parent: BlockHash | None
    refs: int = 0
    children: int = 0
    stamp: int = 0


class BlockCache:
    """Chained block hashes with reference counts and leaf-first LRU eviction."""

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity_blocks = capacity_blocks
        self._blocks: dict[BlockHash, _Block] = {}
        self._leaves: list[tuple[int, BlockHash]] = []  # (stamp, hash) heap; stale entries skipped on pop
        self._clock = itertools.count(1)
        self.pinned_blocks = 0
        self.evicted_total = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: object) -> bool:
        return block in self._blocks

    def hashes(self) -> list[BlockHash]:
        """Held blocks, least recently used first."""
        return [h for h, _ in sorted(self._blocks.items(), key=lambda kv: kv[1].stamp)]

    def refs(self, block: BlockHash) -> int:
        b = self._blocks.get(block)
        return b.refs if b is not None else 0

    def available(self) -> int:
        """Blocks a store could take now: free slots + evictable (unpinned) blocks."""
        return max(0, self.capacity_blocks - self.pinned_blocks)

    def match(self, hashes: Sequence[BlockHash]) -> int:
        """Number of leading `hashes` held (stops at the first miss); changes nothing."""
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            n += 1
        return n

    def pin(self, hashes: Sequence[BlockHash]) -> None:
        """A request now uses these held blocks (its matched prefix): refs + 1, touched."""
        for h in hashes:
            b = self._blocks[h]
            if b.refs == 0:
                self.pinned_blocks += 1
            b.refs += 1
            b.stamp = next(self._clock)

    def release(self, hashes: Sequence[BlockHash]) -> None:
        """A request is done with these blocks: refs - 1, touched last to first (the tail is the
        older), and an unpinned leaf becomes evictable. Blocks no longer held are skipped."""
        for h in reversed(hashes):
            b = self._blocks.get(h)
            if b is None or b.refs == 0:
                continue
            b.refs -= 1
            b.stamp = next(self._clock)
            if b.refs == 0:
                self.pinned_blocks -= 1
                if b.children == 0:
                    heapq.heappush(self._leaves, (b.stamp, h))

    def store(
        self, hashes: Sequence[BlockHash], start: int, end: int, *, force: bool = False
    ) -> tuple[list[int], list[BlockHash]]:
        """Blocks hashes[start:end] were computed by one request, which pins them (blocks
        hashes[:start] must be pinned by it already). Already-held blocks are pinned and touched.

        Without `force` it stores only the prefix of the range that fits (`fits`); with it, all
        (going past capacity when every block is pinned). Returns (indices of newly stored
        blocks, ascending; evicted hashes, in eviction order)."""
        if not force:
            end = self.fits(hashes, start, end)
        missing: list[int] = []
        for i in range(start, end):  # pin what is held first, so making room cannot evict it
            if hashes[i] in self._blocks:
                self.pin([hashes[i]])
            else:
                missing.append(i)
        evicted = self._evict(len(self._blocks) + len(missing) - self.capacity_blocks)
        for i in missing:
            parent = hashes[i - 1] if i > 0 and hashes[i - 1] in self._blocks else None
            if parent is not None:
                self._blocks[parent].children += 1
            self._blocks[hashes[i]] = _Block(parent=parent, refs=1, stamp=next(self._clock))
            self.pinned_blocks += 1
        return missing, evicted

    def fits(self, hashes: Sequence[BlockHash], start: int, end: int) -> int:
        """How far `store(hashes, start, end)` without force gets: the first index it would not
        store (== end when all fit). Each block it would newly pin (missing, or held unpinned)
        needs one of the capacity's slots not already pinned. Changes nothing."""
        budget = self.capacity_blocks - self.pinned_blocks
        for i in range(start, end):
            b = self._blocks.get(hashes[i])
            if b is None or b.refs == 0:
                if budget <= 0:
                    return i
                budget -= 1
        return end

    def clear(self) -> list[BlockHash]:
        """Drop every block (pinned or not); returns what was held."""
        held = list(self._blocks)
        self._blocks.clear()
        self._leaves.clear()
        self.pinned_blocks = 0
        return held

    def _evict(self, n: int) -> list[BlockHash]:
        out: list[BlockHash] = []
        while n > len(out) and self._leaves:
            stamp, h = heapq.heappop(self._leaves)
            b = self._blocks.get(h)
            if b is None or b.refs or b.children or b.stamp != stamp:
                continue  # stale: gone, pinned again, grew a child, or touched since
            del self._blocks[h]
            out.append(h)
            if b.parent is not None:
                p = self._blocks.get(b.parent)
                if p is not None:
                    p.children -= 1
                    if p.children == 0 and p.refs == 0:
                        heapq.heappush(self._leaves, (p.stamp, b.parent))
        self.evicted_total += len(out)
        if len(self._leaves) > 4 * len(self._blocks) + 1024:  # drop stale entries now and then
            self._leaves = [(b.stamp, h) for h, b in self._blocks.items() if not b.refs and not b.children]
            heapq.heapify(self._leaves)
        return out
