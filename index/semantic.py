"""SemanticIndex: cached answers on disk (diskcache), their question vectors in FAISS per scope.

Layout in the diskcache directory (no pickle anywhere: keys are str, values bytes):
  "e:<id>"  entry JSON (scope, exact key, question text, stored response, timestamps)
  "v:<id>"  the question's unit vector, raw float32 bytes (absent for exact-only entries)
  "x:<key>" exact request hash → id
  "next_id" a counter (diskcache's atomic incr), so ids stay unique across restarts
  "d:<seq>" ids deleted (evicted, replaced, expired early), counter "del_seq": how processes
            sharing the directory learn of each other's deletions (index.follow)
  "t:<scope>" tightening marks from wrong-hit feedback (index.tighten), JSON
Every bytes value is sealed (index.sealed.SealedDisk: magic + SHA-256, checked on every read) and
an exact pointer must lead to an entry with that exact key: a damaged item reads as absent, is
served as a miss and counted (`stats()["damaged"]`), and the next miss stores it afresh. A
database that fails SQLite's quick_check on open is moved aside (`<dir>.damaged-<time>`) and the
index starts empty; storage errors while serving (disk full, a page damaged later) make lookups
misses and writes no-ops, counted (`stats()["storage_errors"]`) and logged once per streak.
TTL uses diskcache's own per-key expiry, so an expired entry can never be read; the in-memory
expiry heap only tidies vectors away. LRU by entry count and by bytes (entry JSON + vector) is
kept in memory (restart order is creation order). The FAISS vectors are rebuilt from disk on
open; entries other processes add later are picked up by `catch_up` (every follow_interval_s).
"""
from __future__ import annotations

import heapq
import json
import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import diskcache
import faiss
import numpy as np

from index.recover import open_cache
from index.sealed import SealedDisk
from index.softfail import SoftFailures
from index.follow import DiskFollower
from index.tighten import Mark, decode_marks, encode_marks, floor_from_marks, floor_of, raise_floor
from index.vectors import ScopeVectors

log = logging.getLogger("kvgate.semantic")
TIGHTEN_SEARCH_K = 256  # neighbours of a wrong hit examined for tightening


@dataclass
class CacheEntry:
    """One stored answer and what it answers."""

    id: int
    scope: str
    response: dict[str, Any]
    exact_key: str | None = None
    text: str = ""
    route: str = ""
    model: str = ""
    created: float = field(default_factory=time.time)
    expires: float | None = None
    min_similarity: float | None = None  # per-entry floor raised by wrong-hit feedback (index.tighten)

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "CacheEntry":
        return cls(**json.loads(raw))


class SemanticIndex:
    """Exact and nearest-neighbour lookup of cached answers, partitioned by scope."""

    def __init__(
        self,
        directory: str | Path,
        dim: int,
        max_entries: int = 1_000_000,
        hnsw_above: int = 20_000,
        tighten_margin: float = 0.01,
        max_marks_per_scope: int = 256,
        max_bytes: int | None = None,
        follow_interval_s: float | None = 1.0,
    ) -> None:
        # One query at a time: FAISS's OpenMP threads only fight the embedder's threads for the
        # 2 cores and turn a 0.3 ms search into ~4 ms. (A process-wide FAISS setting.)
        faiss.omp_set_num_threads(1)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.dim = dim
        self.max_entries = max_entries
        self.max_bytes = max_bytes  # stored answer + vector bytes; LRU eviction past it
        self.hnsw_above = hnsw_above
        self.tighten_margin = tighten_margin
        self.max_marks_per_scope = max_marks_per_scope
        # eviction is ours (count-based LRU + TTL); diskcache must never drop entries on its own
        self._soft = SoftFailures(log, f"response cache {self.directory}")
        self._disk = self._open_disk()
        self._lock = threading.RLock()
        self._scopes: dict[str, ScopeVectors] = {}
        self._lru: OrderedDict[int, str] = OrderedDict()  # id → scope, oldest first
        self._expiry: list[tuple[float, int]] = []
        self._sizes: dict[int, int] = {}  # id → bytes it holds on disk (entry JSON + vector)
        self.bytes = 0
        self.evictions = 0
        # other processes on this directory: read before loading, so nothing lands unseen between
        self._follow = DiskFollower(self._disk, follow_interval_s) if follow_interval_s is not None else None
        self._load()

    # ---------------------------------------------------------------- lookups
    def get_exact(self, key: str) -> CacheEntry | None:
        """The live entry stored under exact request hash `key`, if any; storage errors are misses."""
        try:
            entry_id = self._disk.get(f"x:{key}")
            if entry_id is None:
                return None
            entry = self._read(int(entry_id))
            if entry is not None and entry.exact_key != key:  # a damaged pointer: never another request's answer
                self._disk.disk.report(None, f"exact pointer leads to entry {entry.id} of another request")
                self._disk.delete(f"x:{key}")
                return None
        except (sqlite3.Error, OSError, diskcache.Timeout) as exc:
            self._soft.failed("lookup", exc)
            return None
        self._soft.succeeded("lookup")
        if entry is not None:
            self._touch(entry.id)
        return entry

    def search(self, scope: str, vector: np.ndarray, k: int = 1) -> list[tuple[CacheEntry, float]]:
        """As `_search`; a storage error is a miss (counted, logged once per streak)."""
        try:
            found = self._search(scope, vector, k)
        except (sqlite3.Error, OSError, diskcache.Timeout) as exc:
            self._soft.failed("lookup", exc)
            return []
        self._soft.succeeded("lookup")
        return found

    def _search(self, scope: str, vector: np.ndarray, k: int = 1) -> list[tuple[CacheEntry, float]]:
        """Up to k live entries of `scope` nearest to `vector`, with cosine similarity, best first."""
        self.catch_up()
        with self._lock:
            self._expire_due()
            vectors = self._scopes.get(scope)
            hits = vectors.search(vector, k) if vectors is not None else []
        out: list[tuple[CacheEntry, float]] = []
        for entry_id, score in hits:
            entry = self._read(entry_id)
            if entry is None or entry.scope != scope:
                self._forget(entry_id)  # expired or removed by another handle
                continue
            self._touch(entry_id)
            out.append((entry, score))
        return out

    # ---------------------------------------------------------------- writes
    def add(self, scope: str, response: dict[str, Any], **kwargs: Any) -> CacheEntry | None:
        """Store an answer (arguments as `_add`); None when storage failed (disk full, damaged
        database): counted and logged once per streak, never raised to the request."""
        try:
            entry = self._add(scope, response, **kwargs)
        except (sqlite3.Error, OSError, diskcache.Timeout) as exc:
            self._soft.failed("store", exc)
            return None
        self._soft.succeeded("store")
        return entry

    def _add(
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
    ) -> CacheEntry:
        """Store an answer; it becomes findable by `exact_key` and, with a vector, by similarity."""
        entry_id = int(self._disk.incr("next_id"))
        if self._follow is not None:
            self._follow.mine([entry_id])
        now = time.time()
        expires = now + ttl if ttl else None
        entry = CacheEntry(entry_id, scope, response, exact_key, text, route, model, now, expires)
        if vector is not None:  # stored where feedback found the cache wrong: inherits that floor
            entry.min_similarity = floor_from_marks(
                np.asarray(vector, dtype=np.float32).reshape(self.dim), self.marks(scope), self.tighten_margin)
        with self._lock:
            if exact_key is not None:
                old = self._disk.get(f"x:{exact_key}")
                if old is not None:
                    self._delete_locked(int(old))
            # vector before entry, entry before exact pointer: a reader never sees a half entry
            if vector is not None:
                vec = np.ascontiguousarray(vector, dtype=np.float32).reshape(self.dim)
                self._disk.set(f"v:{entry_id}", vec.tobytes(), expire=ttl)
            raw = entry.to_bytes()
            self._disk.set(f"e:{entry_id}", raw, expire=ttl)
            if exact_key is not None:
                self._disk.set(f"x:{exact_key}", entry_id, expire=ttl)
            if vector is not None:
                self._scope(scope).add(np.array([entry_id]), vec.reshape(1, -1))
            self._lru[entry_id] = scope
            self._account(entry_id, len(raw) + (4 * self.dim if vector is not None else 0))
            if expires is not None:
                heapq.heappush(self._expiry, (expires, entry_id))
            self._evict_over_budget()
        return entry

    def add_many_vectors(self, scope: str, items: list[tuple[dict[str, Any], str, np.ndarray]]) -> None:
        """Bulk insert of semantic-only entries (benchmarks, warm-up): (response, text, vector)."""
        if not items:
            return
        last = int(self._disk.incr("next_id", len(items)))
        ids = np.arange(last - len(items) + 1, last + 1, dtype=np.int64)
        if self._follow is not None:
            self._follow.mine(ids.tolist())
        now = time.time()
        vecs = np.ascontiguousarray(np.stack([v for _, _, v in items]), dtype=np.float32)
        sizes = []
        with self._disk.transact():
            for row, (entry_id, (response, text, _)) in enumerate(zip(ids.tolist(), items)):
                entry = CacheEntry(entry_id, scope, response, None, text, created=now)
                raw = entry.to_bytes()
                self._disk.set(f"v:{entry_id}", vecs[row].tobytes())
                self._disk.set(f"e:{entry_id}", raw)
                sizes.append(len(raw) + 4 * self.dim)
        with self._lock:
            self._scope(scope).add(ids, vecs)
            for entry_id, size in zip(ids.tolist(), sizes):
                self._lru[entry_id] = scope
                self._account(entry_id, size)
            self._evict_over_budget()

    def get(self, entry_id: int) -> CacheEntry | None:
        """The live entry with this id, if any."""
        return self._read(entry_id)

    def vector(self, entry_id: int) -> np.ndarray | None:
        """The stored question vector of an entry (None for exact-only or gone entries)."""
        raw = self._disk.get(f"v:{entry_id}")
        return np.frombuffer(raw, dtype=np.float32).copy() if raw is not None and len(raw) == 4 * self.dim else None

    def marks(self, scope: str) -> list[Mark]:
        """The tightening marks of a scope (shared by every process on this cache dir)."""
        return decode_marks(self._disk.get(f"t:{scope}"), self.dim)

    def tighten(self, scope: str, center: np.ndarray, similarity: float, ttl: float | None = None) -> int:
        """After a wrong hit at `similarity` on the entry whose vector is `center`: every entry of
        `scope` at least that close to `center` gets floor `similarity + tighten_margin`, and a mark
        makes later entries there inherit it. Returns how many existing entries were raised.

        Only entries this process's vectors know are raised now; entries another process stored
        since this one started get the floor when that process stores them after the mark, or not
        at all (documented limit: vectors are per process, rebuilt from disk on open)."""
        center = np.ascontiguousarray(center, dtype=np.float32).reshape(self.dim)
        floor = floor_of(similarity, self.tighten_margin)
        with self._lock:
            marks = self.marks(scope)[-(self.max_marks_per_scope - 1):] + [Mark(center, float(similarity), time.time())]
            self._disk.set(f"t:{scope}", encode_marks(marks), expire=ttl)
            vectors = self._scopes.get(scope)
            near = vectors.search(center, min(len(vectors), TIGHTEN_SEARCH_K)) if vectors is not None else []
        raised = 0
        for entry_id, score in near:
            if score < similarity:
                break  # best first: the rest are farther
            entry = self._read(entry_id)
            if entry is None or (entry.min_similarity or 0.0) >= floor:
                continue
            entry.min_similarity = raise_floor(entry.min_similarity, floor)
            remaining = None if entry.expires is None else entry.expires - time.time()
            if remaining is not None and remaining <= 0:
                continue
            with self._disk.transact():  # never resurrect an entry deleted meanwhile
                if f"e:{entry_id}" not in self._disk:
                    continue
                self._disk.set(f"e:{entry_id}", entry.to_bytes(), expire=remaining)
            raised += 1
        return raised

    def delete(self, entry_id: int) -> bool:
        """Remove an entry everywhere; False if it was not there."""
        with self._lock:
            return self._delete_locked(entry_id)

    def __len__(self) -> int:
        self.catch_up()
        return len(self._lru)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "entries": len(self._lru),
                "scopes": len(self._scopes),
                "evictions": self.evictions,
                "bytes": self.bytes,
                "disk_bytes": self._volume(),
                "damaged": self._disk.disk.damaged,
                "storage_errors": self._soft.total,
            }

    def close(self) -> None:
        self._disk.close()

    def _volume(self) -> int:
        """Bytes on disk; -1 when the store cannot say (damaged database, I/O error)."""
        try:
            return int(self._disk.volume())
        except (sqlite3.Error, OSError) as exc:
            self._soft.failed("stats", exc)
            return -1

    def _open_disk(self) -> diskcache.Cache:
        """Open the store (a damaged database is moved aside: index.recover)."""
        # eviction is ours (count-based LRU + TTL); diskcache must never drop entries on its own
        return open_cache(self.directory, log, eviction_policy="none", size_limit=2**62, disk=SealedDisk)

    # ---------------------------------------------------------------- internals
    def _scope(self, scope: str) -> ScopeVectors:
        vectors = self._scopes.get(scope)
        if vectors is None:
            vectors = self._scopes[scope] = ScopeVectors(self.dim, self.hnsw_above)
        return vectors

    def _read(self, entry_id: int) -> CacheEntry | None:
        raw = self._disk.get(f"e:{entry_id}")
        if raw is None:
            return None
        try:
            entry = CacheEntry.from_bytes(raw)
        except (ValueError, TypeError) as exc:  # damaged entry: a miss, and gone
            log.warning("dropping unreadable cache entry %s: %s", entry_id, exc)
            self.delete(entry_id)
            return None
        if entry.id != entry_id:  # an intact value under the wrong key (a damaged database page)
            self._disk.disk.report(None, f"key e:{entry_id} holds entry {entry.id}")
            return None
        return entry

    def _touch(self, entry_id: int) -> None:
        with self._lock:
            if entry_id in self._lru:
                self._lru.move_to_end(entry_id)

    def _forget(self, entry_id: int) -> None:
        with self._lock:
            self._delete_locked(entry_id)

    def _delete_locked(self, entry_id: int) -> bool:
        scope = self._drop_local(entry_id)
        raw = self._disk.get(f"e:{entry_id}")
        if raw is not None:
            try:
                key = json.loads(raw).get("exact_key")
            except ValueError:
                key = None
            if key is not None:
                with self._disk.transact():  # another process may be pointing the key at its new entry
                    if self._disk.get(f"x:{key}") == entry_id:
                        self._disk.delete(f"x:{key}")
        self._disk.delete(f"e:{entry_id}")
        self._disk.delete(f"v:{entry_id}")
        if raw is not None and self._follow is not None:
            self._follow.log_delete(entry_id)
        return scope is not None or raw is not None

    def _drop_local(self, entry_id: int) -> str | None:
        """Forget an entry in this process only (LRU, bytes, vectors); its scope if it was known."""
        scope = self._lru.pop(entry_id, None)
        self.bytes -= self._sizes.pop(entry_id, 0)
        if scope is not None and scope in self._scopes:
            self._scopes[scope].remove([entry_id])
            if len(self._scopes[scope]) == 0:
                del self._scopes[scope]
        return scope

    def _account(self, entry_id: int, size: int) -> None:
        self.bytes += size - self._sizes.get(entry_id, 0)
        self._sizes[entry_id] = size

    def catch_up(self, force: bool = False) -> int:
        """Apply what other processes on this directory added or deleted since the last look
        (index.follow; at most every follow_interval_s). Returns how many entries changed.
        A failing disk skips the catch-up (the next one retries): it never fails a request."""
        try:
            return self._catch_up(force)
        except (sqlite3.Error, OSError, diskcache.Timeout) as exc:
            self._soft.failed("lookup", exc)
            return 0

    def _catch_up(self, force: bool) -> int:
        changes = self._follow.poll(force) if self._follow is not None else None
        if changes is None:
            return 0
        with self._lock:
            for entry_id in changes.removed:
                self._drop_local(entry_id)
        loaded = 0
        for entry_id in changes.added:
            if entry_id in self._lru:
                continue
            entry = self._read(entry_id)
            if entry is None:
                self._follow.missing(entry_id)  # type: ignore[union-attr]
                continue
            self._follow.found(entry_id)  # type: ignore[union-attr]
            raw_vec = self._disk.get(f"v:{entry_id}")
            has_vec = raw_vec is not None and len(raw_vec) == 4 * self.dim
            with self._lock:
                if entry_id in self._lru:
                    continue
                if has_vec:
                    self._scope(entry.scope).add(np.array([entry_id]), np.frombuffer(raw_vec, dtype=np.float32).reshape(1, -1))
                self._lru[entry_id] = entry.scope
                self._account(entry_id, len(entry.to_bytes()) + (4 * self.dim if has_vec else 0))
                if entry.expires is not None:
                    heapq.heappush(self._expiry, (entry.expires, entry_id))
                loaded += 1
        if loaded:
            with self._lock:
                self._evict_over_budget()
        return loaded + len(changes.removed)

    def _evict_over_budget(self) -> None:
        while self._lru and (
            len(self._lru) > self.max_entries or (self.max_bytes is not None and self.bytes > self.max_bytes)
        ):
            oldest = next(iter(self._lru))
            self._delete_locked(oldest)
            self.evictions += 1

    def _expire_due(self) -> None:
        now = time.time()
        while self._expiry and self._expiry[0][0] <= now:
            _, entry_id = heapq.heappop(self._expiry)
            self._delete_locked(entry_id)

    def _load(self) -> None:
        """Rebuild vectors, LRU order and expiry heap from what is on disk."""
        started = time.time()
        by_scope: dict[str, tuple[list[int], list[np.ndarray]]] = {}
        rows: list[tuple[float, int, str]] = []
        for key in self._disk.iterkeys():
            if not (isinstance(key, str) and key.startswith("e:")):
                continue
            entry_id = int(key[2:])
            entry = self._read(entry_id)
            if entry is None:
                self._disk.delete(key)  # damaged (reads as absent) or just expired: nothing to keep
                continue
            rows.append((entry.created, entry_id, entry.scope))
            if entry.expires is not None:
                self._expiry.append((entry.expires, entry_id))
            raw_vec = self._disk.get(f"v:{entry_id}")
            has_vec = raw_vec is not None and len(raw_vec) == 4 * self.dim
            self._account(entry_id, len(entry.to_bytes()) + (4 * self.dim if has_vec else 0))
            if raw_vec is not None and len(raw_vec) == 4 * self.dim:
                ids, vecs = by_scope.setdefault(entry.scope, ([], []))
                ids.append(entry_id)
                vecs.append(np.frombuffer(raw_vec, dtype=np.float32))
        for _, entry_id, scope in sorted(rows):
            self._lru[entry_id] = scope
        heapq.heapify(self._expiry)
        for scope, (ids, vecs) in by_scope.items():
            self._scope(scope).add(np.array(ids, dtype=np.int64), np.stack(vecs))
        self._evict_over_budget()  # the budgets may have shrunk since the last run
        if rows:
            log.info("semantic index: %d entries loaded in %.1fs", len(rows), time.time() - started)
