"""What other processes sharing one entry store added or removed since this one last looked.

Every process keeps its own FAISS vectors and LRU in memory; the entries themselves live in the
shared store (index.entries), so the exact tier is shared at once. For the rest, each process
reads the store's change log (`EntryStore.read_log`: for the disk store two counter reads when
nothing changed) at most every `interval_s`. No process coordinates with another: each applies
what it reads. This module is the policy of following (throttling, skipping one's own ids,
retrying ids not readable yet); the log itself is the store's.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from index.entries.base import ChangeLog


@dataclass
class Changes:
    added: list[int] = field(default_factory=list)  # ids to load (may still be being written)
    removed: list[int] = field(default_factory=list)  # ids deleted by some process


class Follower:
    """Polls a change log at most every `interval_s`; ids listed but not yet readable are retried
    for `pending_s` (a writer between allocating an id and storing it), then given up (deleted,
    or the writer died)."""

    def __init__(self, log: ChangeLog, interval_s: float = 1.0, pending_s: float = 10.0) -> None:
        self.log = log
        self.interval_s = interval_s
        self.pending_s = pending_s
        self._lock = threading.Lock()
        self._cursor = log.log_position()
        self._pending: dict[int, float] = {}  # id → when first found missing
        self._mine: set[int] = set()  # ids this process stored itself, until the log lists them
        self._last = time.monotonic()

    def mine(self, ids: list[int]) -> None:
        """Ids this process allocated itself: it already knows them."""
        with self._lock:
            self._mine.update(ids)

    def poll(self, force: bool = False) -> Changes | None:
        """New and deleted ids since the last poll; None when not due (or another thread polls)."""
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return None
        if not self._lock.acquire(blocking=False):
            return None
        try:
            self._last = now
            self._cursor, added, removed = self.log.read_log(self._cursor)
            fresh = [i for i in added if i not in self._mine]
            self._mine.difference_update(added)
            for i in [i for i, since in self._pending.items() if now - since > self.pending_s]:
                del self._pending[i]
            return Changes([*self._pending, *fresh], removed)
        finally:
            self._lock.release()

    def missing(self, entry_id: int) -> None:
        """An id from `added` had no entry yet: try again at the next polls."""
        with self._lock:
            self._pending.setdefault(entry_id, time.monotonic())

    def found(self, entry_id: int) -> None:
        with self._lock:
            self._pending.pop(entry_id, None)
