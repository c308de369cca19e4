"""SemanticIndex: exact and nearest-neighbour lookup of cached answers, partitioned by scope.

A composition; each part has one job:
  entries   kvgate.index.responses.entries.EntryStore: the shared truth (entries, vectors, exact pointers, TTL,
            marks, change log); by default DiskEntryStore on the cache directory
  vectors   kvgate.index.responses.vectors.ScopedVectors: this process's FAISS copy of the stored vectors, per scope
  eviction  kvgate.index.responses.eviction.LruEviction: LRU order, entry and byte budgets, expiry (pure bookkeeping)
  follow    kvgate.index.responses.follow.Follower: what other processes on the same store added or deleted
  view      kvgate.index.responses.local_view.LocalView (a base class): vectors and eviction kept in step
            with the store (load on open, catch-up from its change log, rebuild when lost)
  tighten   kvgate.index.responses.tighten: floors from wrong-hit feedback, marks kept in the store
  revisions `revision_of(route)`: the model revision a route's backend serves now (set by the
            composition root; None: unknown). Each entry is tagged with the revision it was made
            with (kvgate.index.responses.tags), and one made with another revision is stale: a
            lookup that meets it deletes it and misses

Local first: vectors and LRU are rebuilt from the store on open and kept in memory; every answer
is read from the store, so an entry that vanished there (expired, deleted elsewhere, damaged,
evicted by the backend) is a miss, and its local traces are dropped when met. Storage trouble
(`entries.failures`: disk full, a damaged database, a store out of reach) makes lookups misses and
writes no-ops, counted (`stats()["storage_errors"]`) and logged once per streak (kvgate.index.storage.softfail).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import faiss
import numpy as np

from kvgate.index.responses.entries.base import CacheEntry, EntryStore
from kvgate.index.responses.entries.disk import DiskEntryStore
from kvgate.index.responses.eviction import LruEviction
from kvgate.index.responses.follow import Follower
from kvgate.index.responses.id_blocks import IdBlocks
from kvgate.index.responses.local_view import LocalView
from kvgate.index.responses.tags import model_tag, revision_tag
from kvgate.index.responses.tighten import Mark, floor_from_marks, floor_of, raise_floor
from kvgate.index.responses.vectors import ScopedVectors
from kvgate.index.storage.softfail import Batch, SoftFailures, soft_transaction

__all__ = [
    "CacheEntry",
    "SemanticIndex",
]  # CacheEntry lives in kvgate.index.responses.entries.base; importable from here

log = logging.getLogger("kvgate.semantic")
TIGHTEN_SEARCH_K = 256  # neighbours of a wrong hit examined for tightening
T = TypeVar("T")


class SemanticIndex(LocalView):
    """Exact and nearest-neighbour lookup of cached answers, partitioned by scope."""

    def __init__(
        self,
        directory: str | Path | None,
        dim: int,
        max_entries: int | None = 1_000_000,
        hnsw_above: int = 20_000,
        tighten_margin: float = 0.01,
        max_marks_per_scope: int = 256,
        max_bytes: int | None = None,
        follow_interval_s: float | None = 1.0,
        entries: EntryStore | None = None,
    ) -> None:
        """`entries` (another backend) or `directory` (a DiskEntryStore there) holds the entries."""
        # One query at a time: FAISS's OpenMP threads only fight the embedder's threads for the
        # cores and make a sub-millisecond search many times slower. (A process-wide FAISS setting.)
        faiss.omp_set_num_threads(1)
        if entries is None and directory is None:
            raise ValueError("SemanticIndex needs a directory or an entry store")
        self.directory = Path(directory) if directory is not None else None
        self.dim = dim
        self.hnsw_above = hnsw_above
        self.tighten_margin = tighten_margin
        self.max_marks_per_scope = max_marks_per_scope
        self.entries: EntryStore = entries if entries is not None else DiskEntryStore(directory, dim)  # type: ignore[arg-type]
        self.eviction = LruEviction(max_entries, max_bytes)
        self._soft = SoftFailures(log, f"response cache {self.entries.where}")
        self.vectors = ScopedVectors(dim, hnsw_above)
        self._lock = threading.RLock()  # guards the local view: vectors and eviction (the entries it knows)
        # other processes on this store: read before loading, so nothing lands unseen between
        self._follow = Follower(self.entries, follow_interval_s) if follow_interval_s is not None else None
        # the store's id counter is a write of its own: busy processes reserve ids a block at a time
        self._ids = IdBlocks(self.entries.allocate, self._follow.mine if self._follow is not None else None)
        # a store out of reach at start-up (on_error: degrade) serves misses; the first poll that
        # reaches it rebuilds the view
        self._guarded("lookup", None, self._start)
        self._damaged_seen = self.entries.damaged
        self.revision_of: Callable[[str], str | None] = lambda route: None
        self.stale_dropped = 0  # entries met with another model revision than their route's now

    # budgets and their figures belong to the eviction policy; read here by metrics and tests
    @property
    def max_entries(self) -> int | None:
        return self.eviction.max_entries

    @property
    def max_bytes(self) -> int | None:  # entry JSON + vector bytes
        return self.eviction.max_bytes

    @property
    def bytes(self) -> int:  # held by the entries this process knows
        return self.eviction.bytes

    @property
    def evictions(self) -> int:  # by this process, for the budgets (expiry is not counted)
        return self.eviction.evictions

    # ---------------------------------------------------------------- lookups
    def get_exact(self, key: str) -> CacheEntry | None:
        """The live entry stored under exact request hash `key`, if any; storage errors are misses."""
        entry = self._guarded("lookup", None, lambda: self.entries.get_exact(key))
        if entry is not None and self._stale(entry):
            self.delete(entry.id)
            entry = None
        if entry is not None:
            self._touch(entry.id)
        elif self.entries.damaged != self._damaged_seen:  # the store dropped damage: apply its log now
            self._damaged_seen = self.entries.damaged
            self.catch_up(force=True)
        return entry

    def search(self, scope: str, vector: np.ndarray, k: int = 1) -> list[tuple[CacheEntry, float]]:
        """Up to k live entries of `scope` nearest to `vector`, with cosine similarity, best first;
        a storage error is a miss (counted, logged once per streak)."""
        return self._guarded("lookup", [], lambda: self._search(scope, vector, k))

    def _search(self, scope: str, vector: np.ndarray, k: int) -> list[tuple[CacheEntry, float]]:
        self.catch_up()
        with self._lock:
            self._expire_due()
            hits = self.vectors.search(scope, vector, k)
        out: list[tuple[CacheEntry, float]] = []
        for entry_id, score in hits:
            entry = self.entries.get(entry_id)
            if entry is None or entry.scope != scope or self._stale(entry):
                self.delete(entry_id)  # expired, removed by another handle or stale: gone here too
                continue
            self._touch(entry_id)
            out.append((entry, score))
        return out

    def get(self, entry_id: int) -> CacheEntry | None:
        """The live entry with this id, if any."""
        return self.entries.get(entry_id)

    def vector(self, entry_id: int) -> np.ndarray | None:
        """The stored question vector of an entry (None for exact-only or gone entries)."""
        return self.entries.vector(entry_id)

    def marks(self, scope: str) -> list[Mark]:
        """The tightening marks of a scope (shared by every process on this store)."""
        return self.entries.marks(scope)

    # ---------------------------------------------------------------- writes
    def add(
        self,
        scope: str,
        response: dict[str, Any],
        *,
        exact_key: str | None = None,
        text: str = "",
        vector: np.ndarray | None = None,
        ttl: float | None = None,
        route: str = "",
        model: str = "",
        parents: list[str] | None = None,
        tenant: str | None = None,
        tags: list[str] | None = None,
    ) -> CacheEntry | None:
        """Store an answer; it becomes findable by `exact_key` (replacing the entry stored under it)
        and, with a vector, by similarity; `tenant` and `tags` file it for erasure and invalidation
        (the route's model revision is added to the tags here). None when storage failed (disk
        full, damaged database): counted and logged once per streak, never raised to the request."""
        return self._guarded(
            "store",
            None,
            lambda: self._add(scope, response, exact_key, text, vector, ttl, route, model, parents, tenant, tags),
        )

    def _add(
        self,
        scope: str,
        response: dict[str, Any],
        exact_key: str | None,
        text: str,
        vector: np.ndarray | None,
        ttl: float | None,
        route: str,
        model: str,
        parents: list[str] | None = None,
        tenant: str | None = None,
        tags: list[str] | None = None,
    ) -> CacheEntry:
        entry_id = self._ids.take()
        now = time.time()
        revision = self.revision_of(route) if route else None
        tags = [*(tags or ()), *([model_tag(revision)] if revision is not None else [])]
        entry = CacheEntry(
            entry_id,
            scope,
            response,
            exact_key,
            text,
            route,
            model,
            now,
            now + ttl if ttl else None,
            parents=parents,
            tenant=tenant,
            tags=tags or None,
        )
        vec = None
        if vector is not None:  # stored where feedback found the cache wrong: inherits that floor
            vec = np.ascontiguousarray(vector, dtype=np.float32).reshape(self.dim)
            entry.min_similarity = floor_from_marks(vec, self.marks(scope), self.tighten_margin)
        with self._lock:
            old = self.entries.exact_id(exact_key) if exact_key is not None else None
            if old is not None:
                self._delete_locked(old)
            self._admit(entry, vec, self.entries.put(entry, vec, ttl))
            self._evict_over_budget()
        return entry

    @contextlib.contextmanager
    def batch(self) -> Iterator[Batch]:
        """Stores and deletes made inside commit together at its end (one transaction where the
        store has them); a failure to begin or commit is counted as a failed store, never raised.
        The local view's lock is taken first, as every writer here does, so no thread holding it
        waits on this transaction while it waits on them."""
        with self._lock, soft_transaction(self.entries.batch, self._soft, "store", self.entries.failures) as batch:
            yield batch

    def add_many_vectors(self, scope: str, items: list[tuple[dict[str, Any], str, np.ndarray]]) -> None:
        """Bulk insert of semantic-only entries (benchmarks, warm-up): (response, text, vector)."""
        if not items:
            return
        ids = self.entries.allocate(len(items))
        if self._follow is not None:
            self._follow.mine(ids)
        now = time.time()
        vecs = np.ascontiguousarray(np.stack([v for _, _, v in items]), dtype=np.float32).reshape(len(items), self.dim)
        rows = [CacheEntry(i, scope, response, None, text, created=now) for i, (response, text, _) in zip(ids, items)]
        sizes = self.entries.put_many(list(zip(rows, vecs)))
        with self._lock:
            self.vectors.add(scope, np.asarray(ids, dtype=np.int64), vecs)
            for entry_id, size in zip(ids, sizes):
                self.eviction.add(entry_id, size)
            self._evict_over_budget()

    def tighten(
        self, scope: str, center: np.ndarray, similarity: float, ttl: float | None = None, tenant: str | None = None
    ) -> int:
        """After a wrong hit at `similarity` on the entry whose vector is `center`: every entry of
        `scope` at least that close to `center` gets floor `similarity + tighten_margin`, and a mark
        makes later entries there inherit it. Returns how many existing entries were raised.

        Only entries this process's vectors know are raised now; entries another process stored
        since this one started get the floor when that process stores them after the mark, or not
        at all (documented limit: vectors are per process, rebuilt from the store on open)."""
        center = np.ascontiguousarray(center, dtype=np.float32).reshape(self.dim)
        floor = floor_of(similarity, self.tighten_margin)
        keep = max(0, self.max_marks_per_scope - 1)  # the oldest marks make room for this one
        with self._lock:
            marks = self.marks(scope)
            marks = (marks[-keep:] if keep else []) + [Mark(center, float(similarity), time.time(), tenant)]
            self.entries.set_marks(scope, marks, ttl)
            near = self.vectors.search(scope, center, min(self.vectors.size(scope), TIGHTEN_SEARCH_K))
        raised = 0
        for entry_id, score in near:
            if score < similarity:
                break  # best first: the rest are farther
            entry = self.entries.get(entry_id)
            if entry is None or (entry.min_similarity or 0.0) >= floor:
                continue
            entry.min_similarity = raise_floor(entry.min_similarity, floor)
            raised += self.entries.rewrite(entry)  # False: deleted or expired meanwhile
        return raised

    def _stale(self, entry: CacheEntry) -> bool:
        """Made with another model revision than its route's backend serves now (an unknown
        revision now makes nothing stale; an entry with none is stale once one is known)."""
        current = self.revision_of(entry.route) if entry.route else None
        if current is None or revision_tag(entry.tags) == model_tag(current):
            return False
        self.stale_dropped += 1
        return True

    def delete(self, entry_id: int) -> bool:
        """Remove an entry everywhere; False if it was not there."""
        with self._lock:
            return self._delete_locked(entry_id)

    # ---------------------------------------------------------------- state
    def __len__(self) -> int:
        self.catch_up()
        return len(self.eviction)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {
                "entries": len(self.eviction),
                "scopes": len(self.vectors),
                "evictions": self.evictions,
                "bytes": self.bytes,
            }
        out["disk_bytes"] = self._guarded("stats", -1, self.entries.volume)  # -1: the store cannot say
        out["damaged"] = self.entries.damaged
        out["storage_errors"] = self._soft.total
        return out

    def close(self) -> None:
        self.entries.close()

    def catch_up(self, force: bool = False) -> int:
        """Apply what other processes on this store added or deleted since the last look
        (kvgate.index.responses.follow; at most every follow_interval_s). Returns how many entries changed.
        A failing store skips the catch-up (the next one retries): it never fails a request."""
        return self._guarded("lookup", 0, lambda: self._catch_up(force))

    # ---------------------------------------------------------------- storage errors
    def _guarded(self, op: str, default: T, call: Callable[[], T]) -> T:
        """`call()`, or `default` when the store fails (counted, logged once per streak)."""
        try:
            out = call()
        except self.entries.failures as exc:
            self._soft.failed(op, exc)
            return default
        self._soft.succeeded(op)
        return out
