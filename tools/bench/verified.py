"""The verification stage in `kvgate bench semantic --pairs`: the same lookups with the verifier on.

Given the index already filled with every question1, each question2 is searched for its top
`candidates` entries and served by `kvgate.middleware.cache.verification.choose`, the pipeline's own rule. The
precision pass scores the candidates in batches (same scores, faster); the latency pass does what
a request does, one query at a time: embed, search, verify, choose.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from kvgate.index.responses.embedder import Embedder
from kvgate.index.responses.semantic import SemanticIndex
from kvgate.index.responses.verifier import Verifier
from kvgate.middleware.cache.verification import SemanticSettings, choose, to_verify
from kvgate.tools.bench.stats import percentiles_ms
from kvgate.tools.tuning import calibrate
from kvgate.tools.tuning.calibrate import Candidates
from kvgate.tools.tuning.equivalence import Equivalence, credited


def _lookup(index: SemanticIndex, scope: str, vector: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    found = index.search(scope, vector, k=k)
    return [int(e.response["pair"]) for e, _ in found], [float(s) for _, s in found]


def run_verified(
    index: SemanticIndex,
    scope: str,
    embedder: Embedder,
    verifier: Verifier,
    questions: Sequence[str],
    queries: Sequence[str],
    duplicate: Sequence[bool],
    query_vectors: np.ndarray,
    settings: SemanticSettings,
    latency_texts: Sequence[str],
    warmup: Sequence[str],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Precision/recall/latency with the verifier at `settings`, plus the curve over verifier
    thresholds at the same cosine threshold (an after-the-fact view of these pairs, not a tuned point)."""
    k = settings.candidates
    floors = [settings.threshold] * k
    ids: list[list[int]] = []
    sims: list[list[float]] = []
    for vec in query_vectors:
        found_ids, found_sims = _lookup(index, scope, vec, k)
        ids.append(found_ids)
        sims.append(found_sims)
    todo = [(q, i) for q, s in enumerate(sims) for i in to_verify(s, floors[: len(s)], settings)]
    started = time.perf_counter()
    probs = verifier.score([(questions[ids[q][i]], queries[q]) for q, i in todo]) if todo else np.zeros(0)
    progress(f"verifier: {len(todo)} candidate pairs scored in {time.perf_counter() - started:.1f}s")
    scores: list[dict[int, float]] = [{} for _ in queries]
    for (q, i), p in zip(todo, probs):
        scores[q][i] = float(p)
    served = [choose(s, floors[: len(s)], sc, settings) for s, sc in zip(sims, scores)]
    hits = sum(pos is not None for pos in served)
    eq, dup = Equivalence(zip(questions, queries, duplicate)), [bool(d) for d in duplicate]
    q1, q2 = list(questions), list(queries)
    ok = [pos is not None and credited(q, ids[q][pos], q1, q2, dup, eq) for q, pos in enumerate(served)]
    correct = sum(ok)
    answered = sum(o and d for o, d in zip(ok, dup))
    rejected = sum(pos is None and bool(sc) for pos, sc in zip(served, scores))
    duplicates = sum(duplicate)

    for text in warmup:
        _timed_lookup(index, scope, embedder, verifier, text, settings, questions)
    latencies = []
    for text in latency_texts:
        t0 = time.perf_counter()
        _timed_lookup(index, scope, embedder, verifier, text, settings, questions)
        latencies.append(time.perf_counter() - t0)
    p50, p99 = percentiles_ms(latencies)
    progress(f"verified lookup latency over {len(latencies)} queries done")

    width = max((len(r) for r in ids), default=0)
    cand = Candidates(
        np.array([r + [-1] * (width - len(r)) for r in ids], dtype=np.int64).reshape(len(ids), width),
        np.array([s + [np.nan] * (width - len(s)) for s in sims], dtype=np.float32).reshape(len(ids), width),
        np.array([[sc.get(i, np.nan) for i in range(width)] for sc in scores], dtype=np.float32).reshape(
            len(ids), width
        ),
        np.asarray(duplicate, dtype=bool),
        np.array(
            [
                [i >= 0 and credited(q, i, q1, q2, dup, eq) for i in r + [-1] * (width - len(r))]
                for q, r in enumerate(ids)
            ],
            dtype=bool,
        ).reshape(len(ids), width),
    )
    curve = calibrate.curve(calibrate.sweep(cand, [settings.threshold]))
    return {
        "threshold": settings.threshold,
        "verifier_threshold": settings.verifier_threshold,
        "candidates": k,
        "hits": hits,
        "correct_hits": correct,
        "precision": round(correct / hits, 4) if hits else None,
        "recall": round(answered / duplicates, 4) if duplicates else None,
        "precision_95ci": calibrate.wilson_interval(correct, hits),
        "verifier_rejections": rejected,
        "verified_pairs": len(todo),
        "pairs": len(queries),
        "lookup_p50_ms": p50,
        "lookup_p99_ms": p99,
        "latency_queries": len(latencies),
        "verifier": verifier.name,
        "curve_at_this_cosine_threshold": curve,
    }


def _timed_lookup(
    index: SemanticIndex,
    scope: str,
    embedder: Embedder,
    verifier: Verifier,
    text: str,
    settings: SemanticSettings,
    questions: Sequence[str],
) -> int | None:
    """What the pipeline does per request: embed, search top-k, verify those past the threshold, choose."""
    ids, sims = _lookup(index, scope, embedder.embed([text])[0], settings.candidates)
    floors = [settings.threshold] * len(sims)
    positions = to_verify(sims, floors, settings)
    scores: dict[int, float] = {}
    if positions:
        probs = verifier.score([(questions[ids[i]], text) for i in positions])
        scores = {i: float(p) for i, p in zip(positions, probs)}
    return choose(sims, floors, scores, settings)
