"""Top-k candidates of each lookup in the cache setting, with cosine and verifier scores.

Each pair's question1 is a cached entry and each question2 a lookup over all of them (exact
inner-product search, which is what the FAISS flat index returns); the verifier reads only
candidates at or above `min_cosine`, since no operating point below it is ever considered.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from kvgate.index.responses.embedder import Embedder
from kvgate.index.responses.verifier import Verifier
from kvgate.middleware.progress import Progress
from kvgate.tools.tuning.calibrate import Candidates
from kvgate.tools.tuning.equivalence import Equivalence, credited

SEARCH_BLOCK = 1024


def embed_all(embedder: Embedder, texts: Sequence[str], desc: str = "embedding", batch: int = 512) -> np.ndarray:
    """Embed `texts` in batches, with progress (kvgate.middleware.progress); row i is text i's vector."""
    out = np.empty((len(texts), embedder.dim), dtype=np.float32)
    with Progress(len(texts), desc, unit="texts") as bar:
        for start in range(0, len(texts), batch):
            chunk = list(texts[start : start + batch])
            out[start : start + len(chunk)] = embedder.embed(chunk)
            bar.update(len(chunk))
    return out


def top_k(stored: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices, similarities), each (len(queries), k), best first; exact search in blocks."""
    k = min(k, len(stored))
    idx = np.empty((len(queries), k), dtype=np.int64)
    sim = np.empty((len(queries), k), dtype=np.float32)
    for start in range(0, len(queries), SEARCH_BLOCK):
        scores = queries[start : start + SEARCH_BLOCK] @ stored.T
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        part_scores = np.take_along_axis(scores, part, axis=1)
        order = np.argsort(-part_scores, axis=1, kind="stable")
        idx[start : start + len(scores)] = np.take_along_axis(part, order, axis=1)
        sim[start : start + len(scores)] = np.take_along_axis(part_scores, order, axis=1)
    return idx, sim


def build_candidates(
    q1: Sequence[str],
    q2: Sequence[str],
    duplicate: Sequence[bool],
    v1: np.ndarray,
    v2: np.ndarray,
    verifier: Verifier | None,
    k: int,
    min_cosine: float,
    progress: Callable[[str], None] = lambda _m: None,
) -> Candidates:
    """Search every question2 among all question1 and score the candidates worth verifying."""
    idx, sim = top_k(v1, v2, k)
    prob = np.full(idx.shape, np.nan, dtype=np.float32)
    if verifier is not None:
        todo = [(r, c) for r in range(idx.shape[0]) for c in range(idx.shape[1]) if sim[r, c] >= min_cosine]
        progress(f"verifier: scoring {len(todo)} candidate pairs")
        scores = verifier.score([(q1[idx[r, c]], q2[r]) for r, c in todo]) if todo else np.zeros(0)
        for (r, c), s in zip(todo, scores):
            prob[r, c] = s
    eq = Equivalence(zip(q1, q2, duplicate))
    q1l, q2l, dupl = list(q1), list(q2), [bool(d) for d in duplicate]
    credit = np.array([[credited(r, int(j), q1l, q2l, dupl, eq) for j in row] for r, row in enumerate(idx)], dtype=bool)
    return Candidates(idx, sim, prob, np.asarray(duplicate, dtype=bool), credit.reshape(idx.shape))
