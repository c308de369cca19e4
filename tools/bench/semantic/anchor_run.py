"""GPTCache on the same pairs (kvgate.tools.bench.gptcache_anchor), scored by the same code as kvgate's run."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from kvgate.tools.bench.semantic.report import progress
from kvgate.tools.bench.semantic.scoring import score_returned
from kvgate.tools.bench.stats import percentiles_ms
from kvgate.tools.tuning.pairs import Pair


def anchor_result(
    embedder: Any,
    pairs: Sequence[Pair],
    v1: np.ndarray,
    v2: np.ndarray,
    threshold: float,
    latency_queries: int,
    warmup: Sequence[str],
    ours: Sequence[int | None],
) -> dict[str, Any]:
    """The JSON's `gptcache` object: GPTCache's precision/recall/latency at the cosine `threshold`
    and how many of its answers equal kvgate's (`ours`: the pair kvgate answered with per query,
    None for a miss); {"skipped": reason} when GPTCache cannot run here."""
    from kvgate.tools.bench.gptcache_anchor import require_gptcache, run_gptcache

    reason = require_gptcache()
    if reason is not None:
        return {"skipped": reason}
    progress("gptcache anchor: same embedder, sqlite + faiss stores")
    q1, q2 = [p.question1 for p in pairs], [p.question2 for p in pairs]
    run = run_gptcache(embedder, q1, q2, v1, v2, threshold, latency_queries, warmup, progress)
    g50, g99 = percentiles_ms(run.latencies_s)
    return {
        "threshold": threshold,
        "gptcache_similarity_threshold": round(run.similarity_threshold, 6),
        "max_distance": run.max_distance,
        **score_returned(pairs, run.returned),
        "pairs": len(pairs),
        "lookup_p50_ms": g50,
        "lookup_p99_ms": g99,
        "latency_queries": len(run.latencies_s),
        "same_answer_as_kvgate": sum(a == b for a, b in zip(ours, run.returned)),
        "settings": run.settings,
        "notes": run.notes,
    }
