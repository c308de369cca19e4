"""Proxy-level latency of kvgate at a given cache size: `kvgate bench semantic --entries N`.

Everything runs in this process: the fake OpenAI backend and the kvgate proxy each on a uvicorn
ServerThread on 127.0.0.1, and one persistent httpx client. The scope that the measured requests
use is pre-filled with N filler entries, added in batches through the pipeline's own index:

* `filler="real"` (the default): real questions (QQP and GPTCache's mock pairs) and deterministic
  variants of them (kvgate.tools.bench.semantic_filler), embedded once and cached on disk
  (kvgate.tools.bench.embed_cache). Queries land among near neighbours, as in a production cache, and
  the HNSW search has to work for its answer;
* `filler="random"`: random unit vectors, which no query comes near (the easy case).

Then real requests go through the proxy:

1. seed: SEED_QUESTIONS, each a miss that goes to the backend and is stored (miss latency);
2. exact: the identical seed requests again (exact-tier hits);
3. semantic, sent with `x-kvgate-cache-control: no-store` so a miss does not add an entry, each
   text different so each lookup embeds anew: distinct paraphrases of the seeds ("seed"); with
   the real filler also, interleaved, held-out paraphrases of stored filler questions
   ("paraphrase") and held-out questions whose pair was never stored ("unrelated", should miss).

Hits and misses are timed separately; a hit is "correct" when the answer it returned was stored
for the query's own seed or base question (an unrelated query has none: its hits are wrong).
The fake backend is also timed directly with the same client: the HTTP floor.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx
import numpy as np

from kvgate.engines.demo import create_fake_app
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import parse_config
from kvgate.middleware.pipeline import Pipeline
from kvgate.middleware.request import CacheControl, build_view
from kvgate.middleware.server.proxy import create_app, tenant_of
from kvgate.tools.bench.embed_cache import cache_key, cached_embeddings
from kvgate.tools.bench.procs import ServerThread
from kvgate.tools.bench.seed_questions import SEED_QUESTIONS, paraphrases, semantic_queries
from kvgate.tools.bench.semantic_filler import Query, RealFiller, filler_answer, filler_base, load_real_filler
from kvgate.tools.bench.stats import percentiles_ms

BENCH_TOKEN = "kvgate-bench-key"
BENCH_MODEL = "bench-chat"
FILLER_BATCH = 10_000
WARMUP_REQUESTS = 5
CACHE_HEADER = "x-kvgate-cache"
__all__ = ["SEED_QUESTIONS", "paraphrases", "run_proxy_latency"]  # SEED_QUESTIONS: tests import it from here


def chat_body(question: str) -> dict[str, Any]:
    """The request every measured call sends; only the user message changes."""
    return {"model": BENCH_MODEL, "messages": [{"role": "user", "content": question}]}


def bench_config(cache_dir: Path, backend_url: str, threshold: float, entries: int) -> dict[str, Any]:
    """The proxy config: one route to the fake backend, one accepted key, nothing evicted."""
    return {
        "cache_dir": str(cache_dir),
        "max_entries": max(1_000_000, entries + 10_000),
        "routes": [
            {
                "name": "bench",
                "model": BENCH_MODEL,
                "backend": {
                    "model": "openai/fake",
                    "api_base": f"{backend_url}/v1",
                    "api_key": "sk-fake",
                    "num_retries": 0,
                },
                "ttl": None,
                "scope": "tenant",
                "semantic": {"threshold": threshold},
            }
        ],
        "auth": {"keys": [BENCH_TOKEN]},
    }


def random_unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """n random unit vectors (float32): fillers that a real question never comes near (|cos| ~ 0.05)."""
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs


def filler_response(model: str, content: str = "filler") -> dict[str, Any]:
    """A well-formed stored answer for filler entries (served only by a hit on a filler entry)."""
    return {
        "id": "kvgate-bench-filler",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
    }


@dataclass
class _Sent:
    status: int
    tier: str | None
    elapsed_s: float
    content: str
    similarity: float | None


def _post(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> _Sent:
    t0 = time.perf_counter()
    resp = client.post(url, json=body, headers=headers)
    elapsed = time.perf_counter() - t0
    content = ""
    if resp.status_code == 200:
        choices = resp.json().get("choices") or [{}]
        content = str((choices[0].get("message") or {}).get("content") or "")
    sim = resp.headers.get("x-kvgate-similarity")
    return _Sent(resp.status_code, resp.headers.get(CACHE_HEADER), elapsed, content, float(sim) if sim else None)


def run_proxy_latency(
    entries: int,
    queries: int,
    threshold: float,
    progress: Callable[[str], None] = lambda _msg: None,
    filler: str = "real",
    pairs_path: Path | None = None,
    positives_path: Path | None = None,
) -> dict[str, Any]:
    """Run the whole proxy benchmark and return its JSON-ready result (without `machine`).

    filler: "real" (needs `pairs_path`, and optionally `positives_path`) or "random"."""
    if filler not in ("real", "random"):
        raise ValueError(f"filler must be 'real' or 'random', got {filler!r}")
    started_all = time.perf_counter()
    real: RealFiller | None = None
    if filler == "real":
        if pairs_path is None:
            raise ValueError("the real filler needs pairs_path")
        real = load_real_filler(pairs_path, positives_path)
    measured = semantic_queries(queries, real)
    seed_of = {row[0]: i for i, row in enumerate(SEED_QUESTIONS)}
    notes = [
        "fake backend, proxy and client share one Python process (uvicorn ServerThreads on 127.0.0.1)",
        "index_kind follows SemanticIndex's rule: HNSW once the scope holds more than hnsw_above vectors, flat below",
        "latencies are client-side wall time of one HTTP request on a persistent httpx.Client; hits and misses are timed apart",
        "semantic queries are distinct texts, sent with x-kvgate-cache-control: no-store so misses add no entries",
        "a seed question that gets a semantic hit on the filler (seed_semantic_hits) is sent again with "
        "x-kvgate-cache-control: no-cache, so every seed is stored; miss latency counts the true misses only",
    ]
    notes.append(
        "filler: real questions (every QQP and GPTCache mock question not held out) and deterministic variants of "
        "them (prefixes, suffixes, synonyms, numbers, word swaps); semantic queries interleave hand-written seed "
        "paraphrases, held-out paraphrases of stored filler questions, and held-out unrelated questions"
        if real is not None
        else "filler: random unit vectors (never near a real question)"
    )
    if len(measured) < queries:
        notes.append(f"only {len(measured)} distinct semantic queries exist: semantic queries capped at that")

    with tempfile.TemporaryDirectory(prefix="kvgate-bench-proxy-") as tmp:
        fake = ServerThread(create_fake_app()).start()
        try:
            config = parse_config(bench_config(Path(tmp) / "cache", fake.url, threshold, entries), "bench config")
            progress("proxy bench: loading the embedder")
            pipeline = build_pipeline(config)
            try:
                tenant = tenant_of(BENCH_TOKEN)
                scope = build_view(config, chat_body(SEED_QUESTIONS[0][0]), tenant, CacheControl()).scope
                for text in [s for s, _, _ in SEED_QUESTIONS] + [q.text for q in measured]:
                    if build_view(config, chat_body(text), tenant, CacheControl()).scope != scope:
                        raise RuntimeError(
                            "benchmark requests do not share one scope; the filler would not be searched"
                        )

                fill_started = time.perf_counter()
                fill_info = _fill(pipeline, scope, entries, real, progress)
                fill_s = time.perf_counter() - fill_started
                index = pipeline.index

                proxy = ServerThread(create_app(config, pipeline)).start()
                try:
                    result, stored = _measure(proxy.url, fake.url, measured, seed_of, queries, progress)
                finally:
                    proxy.stop()
                scope_entries = entries + stored
                index_kind = "hnsw" if scope_entries > index.hnsw_above else "flat"
                seed_kind = result["semantic_by_kind"].get("seed", {})
                if real is None and seed_kind.get("hits", 0) < seed_kind.get("requests", 0) and index_kind == "hnsw":
                    notes.append(
                        "the paraphrases were written to be >= 0.80 cosine from their seed with the packaged "
                        "MiniLM, so a semantic miss here is most likely the HNSW search not reaching the seed "
                        "among the random fillers (approximate-index recall)"
                    )
            finally:
                pipeline.close()
        finally:
            fake.stop()

    return {
        "mode": "proxy",
        "filler": filler,
        "entries": entries,
        "scope_entries": scope_entries,
        "index_kind": index_kind,
        "hnsw_above": index.hnsw_above,
        "threshold": threshold,
        "queries": queries,
        **result,
        "filler_s": round(fill_s, 2),
        **fill_info,
        "duration_s": round(time.perf_counter() - started_all, 2),
        "notes": notes,
    }


def _fill(
    pipeline: Pipeline, scope: str, entries: int, real: RealFiller | None, progress: Callable[[str], None]
) -> dict[str, Any]:
    """Add `entries` filler entries to `scope`; returns the JSON fields describing them."""
    index = pipeline.index
    started = time.perf_counter()
    if real is None:
        rng = np.random.default_rng(0)
        filler = filler_response(BENCH_MODEL)
        for start in range(0, entries, FILLER_BATCH):
            n = min(FILLER_BATCH, entries - start)
            vecs = random_unit_vectors(rng, n, index.dim)
            index.add_many_vectors(scope, [(filler, "", vecs[i]) for i in range(n)])
            progress(f"proxy bench: filler {start + n}/{entries} ({time.perf_counter() - started:.1f}s)")
        return {}
    assert pipeline.embedder is not None, "the bench route has the semantic tier on"
    texts = real.texts(entries)
    progress(f"proxy bench: {entries} filler texts ({min(entries, len(real.bases))} questions, the rest variants)")
    vecs, cache = cached_embeddings(
        [t.text for t in texts], pipeline.embedder, cache_key(real.digest, pipeline.embedder.name), progress
    )
    for start in range(0, entries, FILLER_BATCH):
        batch = texts[start : start + FILLER_BATCH]
        index.add_many_vectors(
            scope,
            [
                (filler_response(BENCH_MODEL, filler_answer(t.base)), t.text, vecs[start + i])
                for i, t in enumerate(batch)
            ],
        )
        progress(f"proxy bench: filler {start + len(batch)}/{entries} ({time.perf_counter() - started:.1f}s)")
    return {
        "filler_sources": {
            **real.sources,
            "filler_questions": min(entries, len(real.bases)),
            "filler_variants": max(0, entries - len(real.bases)),
        },
        "filler_cache": {
            "state": cache.state,
            "directory": cache.directory,
            "parts_loaded": cache.parts_loaded,
            "parts_embedded": cache.parts_embedded,
            "embed_s": cache.embed_s,
        },
    }


def _correct(query: Query, content: str, seed_of: dict[str, int]) -> bool:
    """Whether a semantic hit returned the answer stored for the query's own seed or base."""
    if query.kind == "seed":
        answered = content.split(": ", 1)[1] if ": " in content else ""
        return seed_of.get(answered) == query.expected
    if query.kind == "paraphrase":
        return filler_base(content) == query.expected
    return False  # unrelated: nothing of its pair is stored


def _measure(
    proxy_url: str,
    backend_url: str,
    measured: list[Query],
    seed_of: dict[str, int],
    queries: int,
    progress: Callable[[str], None],
) -> tuple[dict[str, Any], int]:
    """Seed, exact, semantic and backend-direct passes against running servers.

    Returns the JSON fields and how many entries the passes stored (warm-ups and seeds).
    """
    chat = "/v1/chat/completions"
    auth = {"authorization": f"Bearer {BENCH_TOKEN}"}
    with httpx.Client(base_url=proxy_url, headers=auth, timeout=60.0) as client:
        for i in range(WARMUP_REQUESTS):  # first litellm call, first embedding, connection set-up
            warm = _post(client, chat, chat_body(f"Benchmark warm-up request number {i}, please ignore."))
            if warm.status != 200:
                raise RuntimeError(f"proxy answered {warm.status} to a warm-up request")

        progress(f"proxy bench: seeding {len(SEED_QUESTIONS)} questions")
        miss_s: list[float] = []
        seed_hits = 0
        for seed, _, _ in SEED_QUESTIONS:
            sent = _post(client, chat, chat_body(seed))
            if sent.status == 200 and sent.tier == "semantic":  # a filler question was close enough:
                seed_hits += 1  # store the seed anyway (no lookup), so the later passes find it
                sent = _post(client, chat, chat_body(seed), {"x-kvgate-cache-control": "no-cache"})
            elif sent.tier == "miss":
                miss_s.append(sent.elapsed_s)
            if sent.status != 200:
                raise RuntimeError(f"proxy answered {sent.status} while seeding")

        progress(f"proxy bench: {queries} exact repeats")
        exact_s: list[float] = []
        for i in range(queries):
            sent = _post(client, chat, chat_body(SEED_QUESTIONS[i % len(SEED_QUESTIONS)][0]))
            if sent.status == 200 and sent.tier == "exact":
                exact_s.append(sent.elapsed_s)

        progress(f"proxy bench: {len(measured)} semantic queries")
        semantic_s: list[float] = []
        semantic_miss_s: list[float] = []
        sims: list[float] = []
        by_kind: dict[str, dict[str, int]] = {}
        missed: list[str] = []
        for query in measured:
            sent = _post(client, chat, chat_body(query.text), {"x-kvgate-cache-control": "no-store"})
            tally = by_kind.setdefault(query.kind, {"requests": 0, "hits": 0, "correct": 0})
            tally["requests"] += 1
            if sent.status == 200 and sent.tier == "semantic":
                semantic_s.append(sent.elapsed_s)
                if sent.similarity is not None:
                    sims.append(sent.similarity)
                tally["hits"] += 1
                tally["correct"] += _correct(query, sent.content, seed_of)
            else:
                if sent.status == 200:
                    semantic_miss_s.append(sent.elapsed_s)
                if query.kind != "unrelated":
                    missed.append(query.text)

        progress(f"proxy bench: {queries} direct backend requests (HTTP floor)")
        direct_s: list[float] = []
        for i in range(WARMUP_REQUESTS + queries):
            sent = _post(
                client,
                f"{backend_url}{chat}",
                {"model": "fake", "messages": [{"role": "user", "content": f"direct {i}"}]},
            )
            if sent.status == 200 and i >= WARMUP_REQUESTS:
                direct_s.append(sent.elapsed_s)

    miss_p50, miss_p99 = percentiles_ms(miss_s)
    exact_p50, exact_p99 = percentiles_ms(exact_s)
    sem_p50, sem_p99 = percentiles_ms(semantic_s)
    sem_miss_p50, sem_miss_p99 = percentiles_ms(semantic_miss_s)
    direct_p50, direct_p99 = percentiles_ms(direct_s)
    if missed:
        print(f"proxy bench: {len(missed)} paraphrase(s) missed, e.g. {missed[0]!r}", file=sys.stderr)
    fields = {
        "seeded": len(SEED_QUESTIONS),
        "seed_misses": len(miss_s),
        "seed_semantic_hits": seed_hits,
        "miss_p50_ms": miss_p50,
        "miss_p99_ms": miss_p99,
        "exact_requests": queries,
        "exact_hits": len(exact_s),
        "exact_hit_p50_ms": exact_p50,
        "exact_hit_p99_ms": exact_p99,
        "semantic_requests": len(measured),
        "semantic_hits": len(semantic_s),
        "semantic_hits_correct": sum(t["correct"] for t in by_kind.values()),
        "semantic_by_kind": by_kind,
        "semantic_hit_p50_ms": sem_p50,
        "semantic_hit_p99_ms": sem_p99,
        "semantic_miss_p50_ms": sem_miss_p50,
        "semantic_miss_p99_ms": sem_miss_p99,
        "semantic_missed_examples": missed[:10],
        "semantic_similarity_min": round(min(sims), 4) if sims else None,
        "semantic_similarity_median": round(float(np.median(sims)), 4) if sims else None,
        "backend_direct_p50_ms": direct_p50,
        "backend_direct_p99_ms": direct_p99,
    }
    return fields, WARMUP_REQUESTS + len(SEED_QUESTIONS)
