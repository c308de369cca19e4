"""SemanticIndex: cached answers on disk (diskcache), their question vectors in FAISS per scope.

Layout in the diskcache directory (no pickle anywhere: keys are str, values bytes):
  "e:<id>"  entry JSON (scope, exact key, question text, stored response, timestamps)
  "v:<id>"  the question's unit vector, raw float32 bytes (absent for exact-only entries)
  "x:<key>" exact request hash → id
  "next_id" a counter (diskcache's atomic incr), so ids stay unique across restarts
TTL uses diskcache's own per-key expiry, so an expired entry can never be read; the in-memory
expiry heap only tidies vectors away. LRU by entry count is kept in memory (restart order is
creation order). The FAISS vectors are rebuilt from disk on open.
"""
from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import diskcache
import faiss
import numpy as np

from index.vectors import ScopeVectors

log = logging.getLogger("kvgate.semantic")


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
    ) -> None:
        # One query at a time: FAISS's OpenMP threads only fight the embedder's threads for the
        # 2 cores and turn a 0.3 ms search into ~4 ms. (A process-wide FAISS setting.)
        faiss.omp_set_num_threads(1)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.dim = dim
        self.max_entries = max_entries
        self.hnsw_above = hnsw_above
        # eviction is ours (count-based LRU + TTL); diskcache must never drop entries on its own
        self._disk = diskcache.Cache(str(self.directory), eviction_policy="none", size_limit=2**62)
        self._lock = threading.RLock()
        self._scopes: dict[str, ScopeVectors] = {}
        self._lru: OrderedDict[int, str] = OrderedDict()  # id → scope, oldest first
        self._expiry: list[tuple[float, int]] = []
        self.evictions = 0
        self._load()

    # ---------------------------------------------------------------- lookups
    def get_exact(self, key: str) -> CacheEntry | None:
        """The live entry stored under exact request hash `key`, if any."""
        entry_id = self._disk.get(f"x:{key}")
        if entry_id is None:
            return None
        entry = self._read(int(entry_id))
        if entry is not None:
            self._touch(entry.id)
        return entry

    def search(self, scope: str, vector: np.ndarray, k: int = 1) -> list[tuple[CacheEntry, float]]:
        """Up to k live entries of `scope` nearest to `vector`, with cosine similarity, best first."""
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
    ) -> CacheEntry:
        """Store an answer; it becomes findable by `exact_key` and, with a vector, by similarity."""
        entry_id = int(self._disk.incr("next_id"))
        now = time.time()
        expires = now + ttl if ttl else None
        entry = CacheEntry(entry_id, scope, response, exact_key, text, route, model, now, expires)
        with self._lock:
            if exact_key is not None:
                old = self._disk.get(f"x:{exact_key}")
                if old is not None:
                    self._delete_locked(int(old))
            # vector before entry, entry before exact pointer: a reader never sees a half entry
            if vector is not None:
                vec = np.ascontiguousarray(vector, dtype=np.float32).reshape(self.dim)
                self._disk.set(f"v:{entry_id}", vec.tobytes(), expire=ttl)
            self._disk.set(f"e:{entry_id}", entry.to_bytes(), expire=ttl)
            if exact_key is not None:
                self._disk.set(f"x:{exact_key}", entry_id, expire=ttl)
            if vector is not None:
                self._scope(scope).add(np.array([entry_id]), vec.reshape(1, -1))
            self._lru[entry_id] = scope
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
        now = time.time()
        vecs = np.ascontiguousarray(np.stack([v for _, _, v in items]), dtype=np.float32)
        with self._disk.transact():
            for row, (entry_id, (response, text, _)) in enumerate(zip(ids.tolist(), items)):
                entry = CacheEntry(entry_id, scope, response, None, text, created=now)
                self._disk.set(f"v:{entry_id}", vecs[row].tobytes())
                self._disk.set(f"e:{entry_id}", entry.to_bytes())
        with self._lock:
            self._scope(scope).add(ids, vecs)
            for entry_id in ids.tolist():
                self._lru[entry_id] = scope
            self._evict_over_budget()

    def delete(self, entry_id: int) -> bool:
        """Remove an entry everywhere; False if it was not there."""
        with self._lock:
            return self._delete_locked(entry_id)

    def __len__(self) -> int:
        return len(self._lru)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "entries": len(self._lru),
                "scopes": len(self._scopes),
                "evictions": self.evictions,
                "disk_bytes": int(self._disk.volume()),
            }

    def close(self) -> None:
        self._disk.close()

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
            return CacheEntry.from_bytes(raw)
        except (ValueError, TypeError) as exc:  # damaged entry: a miss, and gone
            log.warning("dropping unreadable cache entry %s: %s", entry_id, exc)
            self.delete(entry_id)
            return None

    def _touch(self, entry_id: int) -> None:
        with self._lock:
            if entry_id in self._lru:
                self._lru.move_to_end(entry_id)

    def _forget(self, entry_id: int) -> None:
        with self._lock:
            self._delete_locked(entry_id)

    def _delete_locked(self, entry_id: int) -> bool:
        scope = self._lru.pop(entry_id, None)
        raw = self._disk.get(f"e:{entry_id}")
        if raw is not None:
            try:
                key = json.loads(raw).get("exact_key")
            except ValueError:
                key = None
            if key is not None and self._disk.get(f"x:{key}") == entry_id:
                self._disk.delete(f"x:{key}")
        self._disk.delete(f"e:{entry_id}")
        self._disk.delete(f"v:{entry_id}")
        if scope is not None and scope in self._scopes:
            self._scopes[scope].remove([entry_id])
            if len(self._scopes[scope]) == 0:
                del self._scopes[scope]
        return scope is not None or raw is not None

    def _evict_over_budget(self) -> None:
        while len(self._lru) > self.max_entries:
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
                continue
            rows.append((entry.created, entry_id, entry.scope))
            if entry.expires is not None:
                self._expiry.append((entry.expires, entry_id))
            raw_vec = self._disk.get(f"v:{entry_id}")
            if raw_vec is not None and len(raw_vec) == 4 * self.dim:
                ids, vecs = by_scope.setdefault(entry.scope, ([], []))
                ids.append(entry_id)
                vecs.append(np.frombuffer(raw_vec, dtype=np.float32))
        for _, entry_id, scope in sorted(rows):
            self._lru[entry_id] = scope
        heapq.heapify(self._expiry)
        for scope, (ids, vecs) in by_scope.items():
            self._scope(scope).add(np.array(ids, dtype=np.int64), np.stack(vecs))
        if rows:
            log.info("semantic index: %d entries loaded in %.1fs", len(rows), time.time() - started)
