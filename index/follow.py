"""What other processes sharing one cache directory added or removed since this one last looked.

Every process keeps its own FAISS vectors and LRU in memory; the entries themselves live in one
diskcache (SQLite + files), so the exact tier is shared at once. For the rest, ids come from one
atomic counter (`next_id`) and deletions are appended to a log (`d:<seq>`, counter `del_seq`,
kept for DELETE_LOG_TTL_S), so catching up is two counter reads when nothing changed, and one read
per new id or deletion otherwise. No process coordinates with another: each applies what it reads.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

DELETE_LOG_TTL_S = 3600.0


@dataclass
class Changes:
    added: list[int] = field(default_factory=list)  # ids to load (may still be being written)
    removed: list[int] = field(default_factory=list)  # ids deleted by some process


class DiskFollower:
    """Polls the shared counters at most every `interval_s`; ids allocated but not yet readable
    are retried for `pending_s` (a writer between `incr` and `set`), then given up (deleted, or
    the writer died)."""

    def __init__(self, disk: Any, interval_s: float = 1.0, pending_s: float = 10.0) -> None:
        self.disk = disk
        self.interval_s = interval_s
        self.pending_s = pending_s
        self._lock = threading.Lock()
        self._seen_id = int(disk.get("next_id", 0) or 0)
        self._seen_del = int(disk.get("del_seq", 0) or 0)
        self._pending: dict[int, float] = {}  # id → when first found missing
        self._mine: set[int] = set()  # ids this process allocated since the last poll
        self._last = time.monotonic()

    def mine(self, ids: list[int]) -> None:
        """Ids this process allocated itself: it already knows them."""
        with self._lock:
            self._mine.update(ids)

    def log_delete(self, entry_id: int) -> None:
        seq = int(self.disk.incr("del_seq"))
        self.disk.set(f"d:{seq}", entry_id, expire=DELETE_LOG_TTL_S)

    def poll(self, force: bool = False) -> Changes | None:
        """New and deleted ids since the last poll; None when not due (or another thread polls)."""
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return None
        if not self._lock.acquire(blocking=False):
            return None
        try:
            self._last = now
            changes = Changes()
            last_id = int(self.disk.get("next_id", 0) or 0)
            fresh = [i for i in range(self._seen_id + 1, last_id + 1) if i not in self._mine]
            self._mine = {i for i in self._mine if i > last_id}
            self._seen_id = max(self._seen_id, last_id)
            expired = [i for i, since in self._pending.items() if now - since > self.pending_s]
            for i in expired:
                del self._pending[i]
            changes.added = [*self._pending, *fresh]
            last_del = int(self.disk.get("del_seq", 0) or 0)
            for seq in range(self._seen_del + 1, last_del + 1):
                gone = self.disk.get(f"d:{seq}")
                if gone is not None:
                    changes.removed.append(int(gone))
            self._seen_del = max(self._seen_del, last_del)
            return changes
        finally:
            self._lock.release()

    def missing(self, entry_id: int) -> None:
        """An id from `added` had no entry yet: try again at the next polls."""
        with self._lock:
            self._pending.setdefault(entry_id, time.monotonic())

    def found(self, entry_id: int) -> None:
        with self._lock:
            self._pending.pop(entry_id, None)
