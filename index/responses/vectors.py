"""FAISS vectors of one scope, with the index type chosen by size.

Vectors are unit length (see kvgate.index.responses.embedder), so inner product is cosine similarity.
Below `hnsw_above` live vectors the index is exact (flat inner product, removals in place);
above it, an HNSW graph keeps search well under a millisecond at 1M vectors, where a flat scan,
whose cost grows with every vector, would dwarf the rest of a lookup. HNSW cannot remove, so removals there are tombstones, filtered out of
results and compacted away once they pass a quarter of the graph.
"""

from __future__ import annotations

import faiss
import numpy as np

HNSW_M = 32
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 256  # recall ≥ 0.99 on 100k random unit vectors; search stays < 1 ms


class ScopeVectors:
    """id → vector for one scope; `search` returns (id, similarity) best first."""

    def __init__(self, dim: int, hnsw_above: int = 20_000) -> None:
        self.dim = dim
        self.hnsw_above = hnsw_above
        self._index: faiss.Index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        self._hnsw = False
        self._dead: set[int] = set()

    def __len__(self) -> int:
        return int(self._index.ntotal) - len(self._dead)

    @property
    def kind(self) -> str:
        return "hnsw" if self._hnsw else "flat"

    def add(self, ids: np.ndarray, vecs: np.ndarray) -> None:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        vecs = np.ascontiguousarray(vecs, dtype=np.float32).reshape(len(ids), self.dim)
        self._dead.difference_update(int(i) for i in ids)
        self._index.add_with_ids(vecs, ids)
        if not self._hnsw and self._index.ntotal > self.hnsw_above:
            self._rebuild(hnsw=True)

    def remove(self, ids: list[int]) -> None:
        if not ids:
            return
        if not self._hnsw:
            self._index.remove_ids(np.asarray(ids, dtype=np.int64))
            return
        self._dead.update(ids)
        if len(self._dead) > self._index.ntotal // 4:
            self._rebuild(hnsw=len(self) > self.hnsw_above)

    def search(self, vec: np.ndarray, k: int) -> list[tuple[int, float]]:
        if self._index.ntotal == 0:
            return []
        want = min(int(self._index.ntotal), k + len(self._dead) if len(self._dead) < 64 else k * 4)
        query = np.ascontiguousarray(vec, dtype=np.float32).reshape(1, self.dim)
        scores, ids = self._index.search(query, max(1, want))
        out = []
        for i, s in zip(ids[0], scores[0]):
            if i < 0 or int(i) in self._dead:
                continue
            out.append((int(i), float(s)))
            if len(out) == k:
                break
        return out

    def _live(self) -> tuple[np.ndarray, np.ndarray]:
        ids = faiss.vector_to_array(self._index.id_map).astype(np.int64)
        vecs = self._index.index.reconstruct_n(0, int(self._index.ntotal))
        if self._dead:
            keep = np.array([int(i) not in self._dead for i in ids], dtype=bool)
            ids, vecs = ids[keep], vecs[keep]
        return ids, vecs

    def _rebuild(self, hnsw: bool) -> None:
        ids, vecs = self._live()
        if hnsw:
            inner = faiss.IndexHNSWFlat(self.dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
            inner.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
            inner.hnsw.efSearch = HNSW_EF_SEARCH
            index: faiss.Index = faiss.IndexIDMap(inner)
        else:
            index = faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
        if len(ids):
            index.add_with_ids(vecs, ids)
        self._index, self._hnsw, self._dead = index, hnsw, set()


class ScopedVectors:
    """ScopeVectors per scope, and which scope holds each id, so an id can be removed alone.

    Only entries with a vector are here (exact-only entries never reach FAISS, so removing one
    never leaves a tombstone); an empty scope is dropped."""

    def __init__(self, dim: int, hnsw_above: int = 20_000) -> None:
        self.dim = dim
        self.hnsw_above = hnsw_above
        self._scopes: dict[str, ScopeVectors] = {}
        self._scope_of: dict[int, str] = {}

    def __len__(self) -> int:
        """Scopes holding at least one vector."""
        return len(self._scopes)

    def add(self, scope: str, ids: np.ndarray, vecs: np.ndarray) -> None:
        vectors = self._scopes.get(scope)
        if vectors is None:
            vectors = self._scopes[scope] = ScopeVectors(self.dim, self.hnsw_above)
        vectors.add(ids, vecs)
        self._scope_of.update((int(i), scope) for i in ids)

    def remove(self, entry_id: int) -> None:
        scope = self._scope_of.pop(entry_id, None)
        if scope is None:
            return
        vectors = self._scopes[scope]
        vectors.remove([entry_id])
        if len(vectors) == 0:
            del self._scopes[scope]

    def search(self, scope: str, vec: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Up to k (id, similarity) of `scope` nearest to `vec`, best first."""
        vectors = self._scopes.get(scope)
        return vectors.search(vec, k) if vectors is not None else []

    def size(self, scope: str) -> int:
        """Vectors held for `scope`."""
        vectors = self._scopes.get(scope)
        return len(vectors) if vectors is not None else 0
