"""Eviction policy of the response cache: LRU under an entry budget and a byte budget, plus TTL.

Pure bookkeeping, no storage (as LMCache keeps its cache policies apart from its backends): the
policy tracks ids, sizes and expiry times and answers which ids must go; the caller (SemanticIndex)
deletes them from the entry store and the vectors. Each process keeps its own view: on restart the
order is rebuilt from creation times, and deletions by other processes arrive through `remove`.

Invariants:
- after `over_budget()`, `len(self) <= max_entries` and `self.bytes <= max_bytes` (None: no
  limit), the least recently added or touched ids having gone first; an id alone over the byte
  budget goes too, so one large answer cannot wedge the cache;
- `bytes` is the sum of the sizes of the ids tracked, whatever the order of add/remove/re-add;
- `expired(now)` returns each tracked id whose expiry is <= now once, and stops tracking it;
  expiry never counts as an eviction.
A store that evicts on its own (Redis `maxmemory`) can run with both budgets None: entries it drops
read as misses and leave the local view when met.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict


class LruEviction:
    """Least-recently-used order with entry and byte budgets, and an expiry heap."""

    def __init__(self, max_entries: int | None = None, max_bytes: int | None = None) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._order: OrderedDict[int, int] = OrderedDict()  # id → size, least recently used first
        self._expiry: list[tuple[float, int]] = []  # (expires, id); ids removed meanwhile stay until due
        self.bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._order

    def add(self, entry_id: int, size: int, expires: float | None = None) -> None:
        """Track an id as the most recently used (a known id takes its new size)."""
        self.bytes += size - self._order.pop(entry_id, 0)
        self._order[entry_id] = size
        if expires is not None:
            heapq.heappush(self._expiry, (expires, entry_id))

    def touch(self, entry_id: int) -> None:
        """A use: the id becomes the most recently used (unknown ids are ignored)."""
        if entry_id in self._order:
            self._order.move_to_end(entry_id)

    def remove(self, entry_id: int) -> bool:
        """Stop tracking an id (deleted, here or elsewhere); whether it was tracked."""
        size = self._order.pop(entry_id, None)
        if size is None:
            return False
        self.bytes -= size
        return True

    def over_budget(self) -> list[int]:
        """The ids to evict, least recently used first, until both budgets hold; they are no
        longer tracked and count as evictions."""
        out = []
        while self._order and self._over():
            entry_id, size = self._order.popitem(last=False)
            self.bytes -= size
            out.append(entry_id)
        self.evictions += len(out)
        return out

    def expired(self, now: float) -> list[int]:
        """Tracked ids whose expiry is <= now; they are no longer tracked."""
        out = []
        while self._expiry and self._expiry[0][0] <= now:
            _, entry_id = heapq.heappop(self._expiry)
            if self.remove(entry_id):
                out.append(entry_id)
        return out

    def _over(self) -> bool:
        return (self.max_entries is not None and len(self._order) > self.max_entries) or (
            self.max_bytes is not None and self.bytes > self.max_bytes
        )
