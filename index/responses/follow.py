"""What other processes sharing one entry store added or removed since this one last looked.

Every process keeps its own FAISS vectors and LRU in memory; the entries themselves live in the
shared store (kvgate.index.responses.entries), so the exact tier is shared at once. For the rest, each process
reads the store's change log (`EntryStore.read_log`: for the disk store two counter reads when
nothing changed) at most every `interval_s`. No process coordinates with another: each applies
what it reads. This module is the policy of following (throttling, skipping one's own ids,
retrying ids not readable yet, starting over when the log has a gap); the log itself is the
store's. When `read_log` raises LogGap (trimmed past the cursor, store restarted empty), the
follower takes a fresh position *before* the caller rescans the store, so nothing written during
the rescan is missed, and answers `Changes(rebuild=True)`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from kvgate.index.responses.entries.base import ChangeLog, Cursor, LogGap


@dataclass
class Changes:
    added: list[int] = field(default_factory=list)  # ids to load (may still be being written)
    removed: list[int] = field(default_factory=list)  # ids deleted by some process
    rebuild: bool = False  # the log lost track: drop the local view and rebuild it from a scan


class Follower:
    """Polls a change log at most every `interval_s`; ids listed but not yet readable are retried
    for `pending_s` (a writer between allocating an id and storing it), then given up (deleted,
    or the writer died)."""

    def __init__(self, log: ChangeLog, interval_s: float = 1.0, pending_s: float = 10.0) -> None:
        self.log = log
        self.interval_s = interval_s
        self.pending_s = pending_s
        self._lock = threading.Lock()
        self._cursor: Cursor | None = None  # None: no position yet, the next poll starts with a rebuild
        self._pending: dict[int, float] = {}  # id → when first found missing
        self._mine: set[int] = set()  # ids this process stored itself, until the log lists them
        self._last = time.monotonic()
        self._read_at = time.monotonic()  # when the log was last read through (for `lag_s`)
        self.gaps = 0  # times the log lost track and the view was rebuilt

    def begin(self) -> None:
        """Follow from the log's current end (before the caller loads what the store holds)."""
        self._cursor = self.log.log_position()

    def lost(self) -> None:
        """The caller's rebuild failed half-way: the next poll starts over with another."""
        self._cursor = None

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
            try:
                if self._cursor is None:
                    raise LogGap("no position in the log yet")
                self._cursor, added, removed = self.log.read_log(self._cursor)
            except LogGap:
                self._cursor = self.log.log_position()
                self._pending.clear()
                self._mine.clear()
                self.gaps += 1
                self._read_at = time.monotonic()
                return Changes(rebuild=True)
            self._read_at = time.monotonic()
            fresh = [i for i in added if i not in self._mine]
            self._mine.difference_update(added)
            for i in [i for i, since in self._pending.items() if now - since > self.pending_s]:
                del self._pending[i]
            return Changes([*self._pending, *fresh], removed)
        finally:
            self._lock.release()

    def lag_s(self) -> float:
        """Seconds since the log was last read through: how stale this process's view may be
        (about `interval_s` when healthy; grows while the store is out of reach)."""
        return time.monotonic() - self._read_at

    def missing(self, entry_id: int) -> None:
        """An id from `added` had no entry yet: try again at the next polls."""
        with self._lock:
            self._pending.setdefault(entry_id, time.monotonic())

    def found(self, entry_id: int) -> None:
        with self._lock:
            self._pending.pop(entry_id, None)
