"""LocalView: the part of SemanticIndex (kvgate.index.responses.semantic) that keeps this process's
view of the entry store in step with it: the FAISS vectors per scope and the LRU bookkeeping,
loaded from the store on open, caught up from its change log (kvgate.index.responses.follow),
rebuilt when the log lost track of this process, and trimmed to the budgets and expiry.

A base class: SemanticIndex sets the attributes declared here and serves lookups and writes on
top. The methods that change vectors or eviction without taking `_lock` (`_admit`, `_drop_local`,
`_delete_locked`, `_evict_over_budget`, `_expire_due`) are called with it held.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from kvgate.index.responses.entries.base import CacheEntry, EntryStore
from kvgate.index.responses.eviction import LruEviction
from kvgate.index.responses.follow import Follower
from kvgate.index.responses.vectors import ScopedVectors

log = logging.getLogger("kvgate.semantic")


class LocalView:
    """This process's vectors and LRU order of a store's entries, kept in step with the store."""

    entries: EntryStore
    dim: int
    hnsw_above: int
    vectors: ScopedVectors
    eviction: LruEviction
    _lock: threading.RLock
    _follow: Follower | None

    def _catch_up(self, force: bool) -> int:
        changes = self._follow.poll(force) if self._follow is not None else None
        if changes is None or self._follow is None:  # not following, or not due
            return 0
        if changes.rebuild:
            return self._rebuild()
        with self._lock:
            for entry_id in changes.removed:
                self._drop_local(entry_id)
        loaded = 0
        wanted = [i for i in changes.added if i not in self.eviction]
        for entry_id, stored in zip(wanted, self.entries.load_many(wanted)):
            if stored is None:
                self._follow.missing(entry_id)
                continue
            self._follow.found(entry_id)
            with self._lock:
                if entry_id not in self.eviction:
                    self._admit(stored.entry, stored.vector, stored.size)
                    loaded += 1
        if loaded:
            with self._lock:
                self._evict_over_budget()
        return loaded + len(changes.removed)

    def _admit(self, entry: CacheEntry, vector: np.ndarray | None, size: int) -> None:
        """Make a stored entry known here: searchable (with a vector) and tracked for eviction."""
        if vector is not None:
            self.vectors.add(entry.scope, np.array([entry.id]), vector.reshape(1, -1))
        self.eviction.add(entry.id, size, entry.expires)

    def _touch(self, entry_id: int) -> None:
        with self._lock:
            self.eviction.touch(entry_id)

    def _delete_locked(self, entry_id: int) -> bool:
        known = self._drop_local(entry_id)
        return self.entries.delete(entry_id) or known

    def _drop_local(self, entry_id: int) -> bool:
        """Forget an entry in this process only (eviction, vectors); whether it was known."""
        self.vectors.remove(entry_id)
        return self.eviction.remove(entry_id)

    def _evict_over_budget(self) -> None:
        for entry_id in self.eviction.over_budget():
            self._delete_locked(entry_id)

    def _expire_due(self) -> None:
        for entry_id in self.eviction.expired(time.time()):
            self._delete_locked(entry_id)

    def _start(self) -> None:
        """Follow the store's log from its current end, then load what it holds."""
        if self._follow is not None:
            self._follow.begin()
        try:
            self._load()
        except self.entries.failures:
            if self._follow is not None:
                self._follow.lost()  # half a view: the next poll rebuilds it
            raise

    def _rebuild(self) -> int:
        """The store's log lost track of this process (trimmed past it, or the store restarted
        empty): forget the local view and load it again from the store."""
        log.warning("response cache %s: change log lost track; rebuilding the local view", self.entries.where)
        with self._lock:
            evictions = self.eviction.evictions
            self.vectors = ScopedVectors(self.dim, self.hnsw_above)
            self.eviction = LruEviction(self.eviction.max_entries, self.eviction.max_bytes)
            self.eviction.evictions = evictions
        self._start()
        return len(self.eviction)

    def follow_lag_s(self) -> float | None:
        """Seconds since this process last read the store's change log through (None: not following)."""
        return self._follow.lag_s() if self._follow is not None else None

    def _load(self) -> None:
        """Rebuild vectors, LRU order (creation order) and expiry from what the store holds."""
        started = time.time()
        by_scope: dict[str, tuple[list[int], list[np.ndarray]]] = {}
        rows: list[tuple[float, int, int, float | None]] = []
        for stored in self.entries.scan():
            entry = stored.entry
            rows.append((entry.created, entry.id, stored.size, entry.expires))
            if stored.vector is not None:
                ids, vecs = by_scope.setdefault(entry.scope, ([], []))
                ids.append(entry.id)
                vecs.append(stored.vector)
        with self._lock:
            for _, entry_id, size, expires in sorted(rows):
                self.eviction.add(entry_id, size, expires)
            for scope, (ids, vecs) in by_scope.items():
                self.vectors.add(scope, np.array(ids, dtype=np.int64), np.stack(vecs))
            self._evict_over_budget()  # the budgets may have shrunk since the last run
        if rows:
            log.info("semantic index: %d entries loaded in %.1fs", len(rows), time.time() - started)
