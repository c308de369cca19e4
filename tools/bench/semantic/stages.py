"""Where one semantic lookup's time goes, kvgate vs GPTCache: `kvgate bench semantic --pairs FILE --stages`.

Both caches hold every question1 in one process with the same ONNX embedder object, and FAISS runs
on one thread in both (SemanticIndex sets it, process-wide). Each of the first --latency-queries
question2 is looked up in both, one right after the other (which goes first alternates), so load on
a shared machine falls on both alike; a warm-up of WARMUP_QUERIES lookups each comes first.

kvgate, per query: `embed` (the embedder), then `search` (SemanticIndex.search, k=1). The two parts
of that search are timed again on their own with the same vector: `faiss_search` on a ScopeVectors
holding the same vectors, `entry_read` = SemanticIndex.get of the entry found (diskcache get + JSON
decode); `search_rest` = search - both (lock, follower poll, expiry check, LRU touch). After the
lookup, outside it: `request_id_write`, the RequestLog.record a proxy request adds for feedback
(middleware/cache/request_log.py, a diskcache set beside the responses, the config's default bounds).

GPTCache, per query: `get` (gptcache.adapter.api). Its stages come from GPTCache's own Report
counters, which `adapt` feeds whether or not the report is disabled: `pre_process` (get_prompt),
`embedding`, `search` (normalize + FAISS), `get_data` (the scalar store: SQLAlchemy
`get_data_by_id`), `evaluation`, `post_process`; `other` = get - their sum (adapt itself, the
eviction memory cache's hit callback). The scalar fetch is timed again with plain sqlite3 on the
same file and the same row: `sqlite_selects` (the four SELECTs get_data_by_id issues) and
`sqlite_update_commit` (its UPDATE of last_access and the COMMIT it makes on every fetch). The JSON
gives both stores' sqlite journal modes (kvgate's diskcache: WAL, synchronous NORMAL).

All figures are in ms per lookup (mean and p50 over the queries); none is pass/fail.
"""

from __future__ import annotations

import sqlite3
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import numpy as np

from kvgate.tools.bench.machine import machine_info
from kvgate.tools.bench.semantic.pairs_run import SCOPE, WARMUP_QUERIES, embed_batched, load_pairs
from kvgate.tools.bench.semantic.report import fmt, progress

KVGATE_STAGES = ("embed", "faiss_search", "entry_read", "search_rest")
GPTCACHE_STAGES = ("pre_process", "embedding", "search", "get_data", "evaluation", "post_process", "other")
_REPORT_COUNTERS = {
    "pre_process": "op_pre",
    "embedding": "op_embedding",
    "search": "op_search",
    "get_data": "op_data",
    "evaluation": "op_evaluation",
    "post_process": "op_post",
}
_SELECTS = (  # what gptcache 0.1.44's SQLStorage.get_data_by_id asks for one id, table prefix "gptcache"
    "SELECT id, question, create_on, last_access, embedding_data, deleted FROM gptcache_question WHERE id = ? AND deleted = 0 LIMIT 1",
    "SELECT answer, answer_type FROM gptcache_answer WHERE question_id = ?",
    "SELECT dep_name, dep_data, dep_type FROM gptcache_question_dep WHERE question_id = ?",
    "SELECT session_id FROM gptcache_session WHERE question_id = ?",
)


def stage_summary(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """{stage: {"mean_ms", "p50_ms"}} of per-query seconds. Means add up: the mean of a stage
    defined as a difference (search_rest, other) is the difference of the means."""
    return {
        name: {"mean_ms": round(statistics.fmean(xs) * 1000, 4), "p50_ms": round(statistics.median(xs) * 1000, 4)}
        for name, xs in samples.items()
        if xs
    }


def _journal_mode(path: Path) -> str:
    """The journal mode of a sqlite file (or of diskcache's cache.db in a directory)."""
    with sqlite3.connect(path / "cache.db" if path.is_dir() else path) as db:
        return str(db.execute("PRAGMA journal_mode").fetchone()[0])


def _kvgate_lookup(
    index: Any, copy: Any, embedder: Any, requests: Any, text: str, threshold: float
) -> tuple[dict[str, float], bool]:
    """One kvgate lookup of `text` by stage (seconds; module docstring), and whether it hit."""
    from kvgate.middleware.cache.request_log import RequestRecord, new_request_id

    t0 = time.perf_counter()
    vec = embedder.embed([text])[0]
    t1 = time.perf_counter()
    found = index.search(SCOPE, vec, k=1)
    t2 = time.perf_counter()
    copy.search(vec, 1)
    t3 = time.perf_counter()
    if found:
        index.get(found[0][0].id)
    t4 = time.perf_counter()
    entry, similarity = (found[0][0].id, float(found[0][1])) if found else (None, None)
    requests.record(new_request_id(), RequestRecord("bench", "bench", "semantic", SCOPE, entry, similarity))
    t5 = time.perf_counter()
    timings = {
        "lookup": t2 - t0,
        "embed": t1 - t0,
        "search": t2 - t1,
        "faiss_search": t3 - t2,
        "entry_read": t4 - t3,
        "search_rest": (t2 - t1) - (t3 - t2) - (t4 - t3),
        "request_id_write": t5 - t4,
    }
    return timings, similarity is not None and similarity >= threshold


def _gptcache_lookup(
    cache: Any, get: Callable[..., Any], db: sqlite3.Connection, text: str, vec: np.ndarray
) -> tuple[dict[str, float], bool]:
    """One GPTCache `get` of `text` by stage (seconds; module docstring), and whether it hit; `vec`
    (the text's embedding) finds the row whose scalar fetch plain sqlite3 repeats."""
    report = cache.report
    before = {name: getattr(report, attr).total_time for name, attr in _REPORT_COUNTERS.items()}
    t0 = time.perf_counter()
    answer = get(text, cache_obj=cache)
    total = time.perf_counter() - t0
    out = {name: getattr(report, attr).total_time - before[name] for name, attr in _REPORT_COUNTERS.items()}
    out["other"] = total - sum(out.values())
    out["lookup"] = total
    found = cache.data_manager.search(vec, top_k=1) or []  # the same row, untimed
    if found:
        key = int(found[0][1])
        t0 = time.perf_counter()
        for sql in _SELECTS:
            db.execute(sql, (key,)).fetchall()
        t1 = time.perf_counter()
        db.execute("UPDATE gptcache_question SET last_access = ? WHERE id = ?", (datetime.now().isoformat(" "), key))
        db.commit()
        out["sqlite_selects"], out["sqlite_update_commit"] = t1 - t0, time.perf_counter() - t1
    return out, answer is not None


def run_stages(path: Path, threshold: float, limit: int | None, queries: int) -> dict[str, Any]:
    """The --stages run (module docstring); returns the JSON-ready result."""
    from gptcache.adapter.api import get

    from kvgate.index.responses.embedder import make_embedder
    from kvgate.index.responses.semantic import SemanticIndex
    from kvgate.index.responses.vectors import ScopeVectors
    from kvgate.middleware.cache.request_log import DiskRequestLog
    from kvgate.middleware.config import FeedbackConfig
    from kvgate.tools.bench.gptcache_anchor import GptcacheEmbedding, open_gptcache, require_gptcache
    from kvgate.tools.tuning.pairs import BenchInputError

    reason = require_gptcache()
    if reason is not None:
        raise BenchInputError(f"--stages compares with GPTCache, which cannot run here: {reason}")
    started_all = time.perf_counter()
    pairs, _, _ = load_pairs(path, limit, holdout=False)
    embedder = make_embedder("onnx")
    q1, q2 = [p.question1 for p in pairs], [p.question2 for p in pairs]
    v1, v2 = embed_batched(embedder, q1, "question1"), embed_batched(embedder, q2[:queries], "question2")
    texts, warmup = q2[:queries], q1[-WARMUP_QUERIES:]
    ours: dict[str, list[float]] = {k: [] for k in ("lookup", "embed", "search", *KVGATE_STAGES, "request_id_write")}
    theirs: dict[str, list[float]] = {
        k: [] for k in ("lookup", *GPTCACHE_STAGES, "sqlite_selects", "sqlite_update_commit")
    }
    hits = {"kvgate": 0, "gptcache": 0}
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-stages-") as tmp:
        index = SemanticIndex(Path(tmp) / "index", embedder.dim, max_entries=len(pairs) + 1)
        defaults = FeedbackConfig()
        requests = DiskRequestLog(Path(tmp) / "requests", defaults.record_ttl, int(defaults.record_max_mb * 2**20))
        embedding = GptcacheEmbedding(embedder)
        embedding.remember(q1, v1)
        try:
            index.add_many_vectors(SCOPE, [({"pair": i}, q1[i], v1[i]) for i in range(len(pairs))])
            copy = ScopeVectors(embedder.dim, index.hnsw_above)
            copy.add(np.arange(len(pairs)), v1)
            with open_gptcache(embedding, q1, threshold, progress) as (cache, db_path):
                embedding.forget()  # from here every GPTCache lookup embeds for real, as kvgate's do
                db = sqlite3.connect(db_path)
                journal = {
                    "gptcache_sqlite": _journal_mode(db_path),
                    "kvgate_diskcache": _journal_mode(index.directory),
                }
                try:
                    for text in warmup:
                        _kvgate_lookup(index, copy, embedder, requests, text, threshold)
                        _gptcache_lookup(cache, get, db, text, v1[0])
                    progress(f"timing {len(texts)} lookups by stage in kvgate and GPTCache, interleaved")
                    for i, text in enumerate(texts):
                        for side in (0, 1) if i % 2 == 0 else (1, 0):
                            if side == 0:
                                timing, hit = _kvgate_lookup(index, copy, embedder, requests, text, threshold)
                                hits["kvgate"] += hit
                                for name, value in timing.items():
                                    ours[name].append(value)
                            else:
                                timing, hit = _gptcache_lookup(cache, get, db, text, v2[i])
                                hits["gptcache"] += hit
                                for name, value in timing.items():
                                    theirs[name].append(value)
                finally:
                    db.close()
        finally:
            index.close()
            requests.close()
    return {
        "mode": "stages",
        "pairs_file": str(path),
        "pairs": len(pairs),
        "threshold": threshold,
        "latency_queries": len(texts),
        "hits": hits,
        "index_kind": copy.kind,
        "journal_mode": journal,
        "embedder": embedder.name,
        "kvgate": stage_summary(ours),
        "gptcache": stage_summary(theirs),
        "duration_s": round(time.perf_counter() - started_all, 2),
        "machine": machine_info(),
        "notes": [
            "each query looked up in kvgate and in GPTCache back to back, the first of the two alternating",
            "kvgate: faiss_search and entry_read re-timed alone on the same vector / entry; search_rest = search - both",
            "gptcache: stages from its Report counters (fed even with disable_report); other = get - their sum; "
            "sqlite_selects / sqlite_update_commit: get_data_by_id's statements by plain sqlite3 on the same row",
        ],
    }


def print_stages(result: dict[str, Any]) -> None:
    """Per stage, mean and p50 ms per lookup, kvgate beside GPTCache."""
    print(
        f"one lookup by stage, {result['latency_queries']} queries over {result['pairs']} entries "
        f"({result['index_kind']}), interleaved; hits at cosine {result['threshold']}: {result['hits']}"
    )
    print(f"{'cache':<10}{'stage':<22}{'mean ms':>9}{'p50 ms':>9}")
    for cache, stages in (
        ("kvgate", ("lookup", "embed", "search", *KVGATE_STAGES[1:], "request_id_write")),
        ("gptcache", ("lookup", *GPTCACHE_STAGES, "sqlite_selects", "sqlite_update_commit")),
    ):
        for name in stages:
            s = result[cache].get(name)
            if s is not None:
                print(f"{cache:<10}{name:<22}{fmt(s['mean_ms']):>9}{fmt(s['p50_ms']):>9}")
