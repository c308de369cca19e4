"""Proxy-level latency of kvgate at a given cache size: `kvgate bench semantic --entries N`.

Everything runs in this process: the fake OpenAI backend and the kvgate proxy each on a uvicorn
ServerThread on 127.0.0.1, and one persistent httpx client. The scope that the measured requests
use is pre-filled with N filler entries (random unit vectors, added in batches through the
pipeline's own index), then real requests go through the proxy:

1. seed: SEED_QUESTIONS, each a miss that goes to the backend and is stored (miss latency);
2. exact: the identical seed requests again (exact-tier hits);
3. semantic: distinct paraphrases of the seeds (each text different, so each lookup embeds anew),
   sent with `x-kvgate-cache-control: no-store` so a miss does not add an entry.

Only requests whose `x-kvgate-cache` header says they hit are timed; hits are counted, and a
semantic hit is "correct" when the answer it returned was stored for the same seed.
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

from engines.demo import create_fake_app
from tools.bench.procs import ServerThread
from middleware.config import parse_config
from middleware.pipeline import Pipeline
from middleware.proxy import create_app, tenant_of
from middleware.request import CacheControl, build_view
from tools.bench.stats import percentiles_ms

BENCH_TOKEN = "kvgate-bench-key"
BENCH_MODEL = "bench-chat"
FILLER_BATCH = 10_000
WARMUP_REQUESTS = 5
CACHE_HEADER = "x-kvgate-cache"

# (seed question, two hand-written paraphrases). Topics are kept apart so a paraphrase has one right seed.
SEED_QUESTIONS: tuple[tuple[str, str, str], ...] = (
    ("How do I reset my password if I forgot it?", "I forgot my password, how can I reset it?", "What is the way to reset a forgotten password?"),
    ("What is the capital city of Australia?", "Which city is the capital of Australia?", "What city serves as Australia's capital?"),
    ("How can I improve my sleep quality?", "How can I improve the quality of my sleep?", "How do I get better quality sleep?"),
    ("What are the health benefits of drinking green tea?", "Is drinking green tea good for your health?", "What health benefits does green tea have?"),
    ("How do I make a sourdough starter at home?", "What is the way to create a sourdough starter at home?", "How can I make my own sourdough starter?"),
    ("What is the difference between a virus and a bacterium?", "How are viruses different from bacteria?", "What distinguishes a virus from a bacterium?"),
    ("How do I convert Celsius to Fahrenheit?", "What is the formula to convert Celsius into Fahrenheit?", "How can I change a temperature from Celsius to Fahrenheit?"),
    ("What are good exercises to strengthen my lower back?", "Which exercises strengthen the lower back?", "How can I build strength in my lower back with exercise?"),
    ("How do I learn to play the guitar as a beginner?", "What is the best way for a beginner to learn guitar?", "How should a beginner start learning to play the guitar?"),
    ("Why is the sky blue?", "What makes the sky look blue?", "Why does the sky appear blue during the day?"),
    ("How do I remove a red wine stain from a carpet?", "How can I get a red wine stain out of carpet?", "What is the best way to clean red wine off a carpet?"),
    ("What is the best way to save money for retirement?", "How should I save money for my retirement?", "What are the best ways to save for retirement?"),
    ("How do I write a good cover letter for a job application?", "How can I write a strong cover letter when applying for a job?", "What makes a good cover letter for a job application?"),
    ("What causes earthquakes?", "Why do earthquakes happen?", "What is the cause of an earthquake?"),
    ("How do I grow tomatoes in pots?", "How can I grow tomatoes in containers?", "What is the best way to grow tomato plants in pots?"),
    ("How long should I boil an egg for a soft yolk?", "How many minutes do I boil an egg to get a soft yolk?", "What is the boiling time for an egg with a soft yolk?"),
    ("What is machine learning in simple terms?", "Can you explain machine learning in simple terms?", "What does machine learning mean in plain language?"),
    ("How do I change a flat tire on my car?", "How can I replace a flat tire on a car?", "What are the steps to change a flat car tire?"),
    ("What are the symptoms of dehydration?", "What are the signs that I am dehydrated?", "What symptoms show that someone is dehydrated?"),
    ("How do I train my puppy to stop biting?", "How can I stop my puppy from biting?", "What is the best way to train a puppy not to bite?"),
    ("What is the tallest mountain in the world?", "Which mountain is the highest in the world?", "What is the world's highest mountain?"),
    ("How do I cook rice in a pot without a rice cooker?", "How can I cook rice on the stove without a rice cooker?", "What is the way to make rice in a pot instead of a rice cooker?"),
    ("How can I reduce stress at work?", "What are ways to lower stress at my job?", "How do I reduce stress in my job?"),
    ("What is the speed of light?", "How fast is the speed of light?", "What is the speed at which light travels?"),
    ("How do I clean a cast iron skillet?", "What is the right way to clean a cast iron pan?", "How should I wash a cast iron skillet?"),
    ("What are the rules of chess for beginners?", "What are the basic chess rules for a beginner?", "How do the rules of chess work for beginners?"),
    ("How do I start running if I am out of shape?", "How can I begin running when I am out of shape?", "What is a good way to start running when I am not fit?"),
    ("How do vaccines work?", "How does a vaccine work in the body?", "What is the way vaccines work?"),
    ("How do I set up a home Wi-Fi network?", "How can I set up Wi-Fi at home?", "What are the steps to set up a Wi-Fi network at home?"),
    ("What is the best way to learn a new language?", "How can I learn a new language effectively?", "What is the most effective way to learn a new language?"),
    ("How do I unclog a kitchen sink drain?", "How can I unclog the drain of my kitchen sink?", "What is the best way to unclog my kitchen sink drain?"),
    ("Why do leaves change color in autumn?", "Why do tree leaves change color in the fall?", "What makes leaves change colour in autumn?"),
    ("How do I calculate compound interest?", "What is the formula for calculating compound interest?", "How can I work out compound interest?"),
    ("How do I get rid of fruit flies in my kitchen?", "How can I eliminate fruit flies in the kitchen?", "What is the best way to get rid of kitchen fruit flies?"),
    ("What are the main causes of climate change?", "What causes climate change?", "What are the primary causes of climate change?"),
    ("How do I make cold brew coffee?", "How can I make cold brew coffee at home?", "What is the method for making cold brew coffee?"),
    ("How do I negotiate a higher salary?", "How can I negotiate for a bigger salary?", "What is the best way to negotiate a higher salary?"),
    ("How many planets are in our solar system?", "How many planets does our solar system have?", "What is the number of planets in the solar system?"),
    ("How do I back up my iPhone?", "How can I make a backup of my iPhone?", "What is the way to back up an iPhone?"),
    ("What is the difference between weather and climate?", "How is weather different from climate?", "What distinguishes weather from climate?"),
    ("How do I care for a succulent plant indoors?", "How should I take care of an indoor succulent plant?", "What is the right way to care for succulents indoors?"),
    ("How do I fix a leaking faucet?", "How can I repair a leaking faucet?", "How do I repair a leaking faucet?"),
    ("What are the benefits of meditation?", "What are the advantages of meditating?", "What benefits does meditation have?"),
    ("How do I write a for loop in Python?", "How can I write a for loop in Python?", "What is the syntax of a for loop in Python?"),
    ("How do I prepare for a job interview?", "How should I get ready for a job interview?", "What is the best way to prepare for an interview for a job?"),
    ("What is photosynthesis?", "Can you explain what photosynthesis is?", "What does photosynthesis mean?"),
    ("How do I jump start a car battery?", "How can I jump-start a dead car battery?", "What are the steps to jump start a car battery?"),
    ("How much water should I drink every day?", "How much water should a person drink each day?", "What is the recommended amount of water to drink every day?"),
    ("How do I make a budget for my household?", "How can I create a household budget?", "What is the best way to make a budget for my household?"),
    ("What is the boiling point of water at high altitude?", "At what temperature does water boil at high altitude?", "What is water's boiling point at high altitudes?"),
)
# Wrappers that make more distinct texts out of each hand-written paraphrase.
PARAPHRASE_WRAPPERS: tuple[str, ...] = (
    "{}",
    "Quick question: {}",
    "{} Thanks!",
    "Can you help me? {}",
    "Hi! {}",
    "I'd like to know: {}",
    "{} Please answer briefly.",
)


def paraphrases() -> list[tuple[int, str]]:
    """(seed index, text) for every distinct paraphrase, hand-written ones first, all texts unique."""
    out: list[tuple[int, str]] = []
    seen = {seed for seed, _, _ in SEED_QUESTIONS}
    for wrapper in PARAPHRASE_WRAPPERS:
        for column in (1, 2):
            for i, row in enumerate(SEED_QUESTIONS):
                text = wrapper.format(row[column])
                if text not in seen:
                    seen.add(text)
                    out.append((i, text))
    return out


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
                "backend": {"model": "openai/fake", "api_base": f"{backend_url}/v1", "api_key": "sk-fake", "num_retries": 0},
                "semantic": {"threshold": threshold, "ttl": None, "scope": "tenant"},
            }
        ],
        "auth": {"keys": [BENCH_TOKEN]},
    }




def random_unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """n random unit vectors (float32): fillers that a real question never comes near (|cos| ~ 0.05)."""
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs


def filler_response(model: str) -> dict[str, Any]:
    """A well-formed stored answer for filler entries (never expected to be served)."""
    return {
        "id": "kvgate-bench-filler", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "filler"}, "finish_reason": "stop"}],
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
) -> dict[str, Any]:
    """Run the whole proxy benchmark and return its JSON-ready result (without `machine`)."""
    started_all = time.perf_counter()
    texts = paraphrases()
    seed_of = {row[0]: i for i, row in enumerate(SEED_QUESTIONS)}
    notes = [
        "fake backend, proxy and client share one Python process (uvicorn ServerThreads on 127.0.0.1)",
        "filler entries are random unit vectors (never near a real question); "
        "index_kind follows SemanticIndex's rule: HNSW once the scope holds more than hnsw_above vectors, flat below",
        "latencies are client-side wall time of one HTTP request on a persistent httpx.Client; only hits are timed",
        "semantic queries are distinct paraphrases (hand-written, then wrapped in fixed phrases), "
        "sent with x-kvgate-cache-control: no-store so misses add no entries",
    ]
    if queries > len(texts):
        notes.append(f"only {len(texts)} distinct paraphrases exist: semantic queries capped at that")
    semantic_texts = texts[:queries]

    with tempfile.TemporaryDirectory(prefix="kvgate-bench-proxy-") as tmp:
        fake = ServerThread(create_fake_app()).start()
        try:
            config = parse_config(bench_config(Path(tmp) / "cache", fake.url, threshold, entries), "bench config")
            progress("proxy bench: loading the embedder")
            pipeline = Pipeline(config)
            try:
                tenant = tenant_of(BENCH_TOKEN)
                scope = build_view(config, chat_body(SEED_QUESTIONS[0][0]), tenant, CacheControl()).scope
                for text in [s for s, _, _ in SEED_QUESTIONS] + [t for _, t in semantic_texts]:
                    if build_view(config, chat_body(text), tenant, CacheControl()).scope != scope:
                        raise RuntimeError("benchmark requests do not share one scope; the filler would not be searched")

                fill_started = time.perf_counter()
                rng = np.random.default_rng(0)
                filler = filler_response(BENCH_MODEL)
                index = pipeline.index
                for start in range(0, entries, FILLER_BATCH):
                    n = min(FILLER_BATCH, entries - start)
                    vecs = random_unit_vectors(rng, n, index.dim)
                    index.add_many_vectors(scope, [(filler, "", vecs[i]) for i in range(n)])
                    progress(f"proxy bench: filler {start + n}/{entries} ({time.perf_counter() - fill_started:.1f}s)")
                fill_s = time.perf_counter() - fill_started

                proxy = ServerThread(create_app(config, pipeline)).start()
                try:
                    result, stored = _measure(proxy.url, fake.url, semantic_texts, seed_of, queries, progress)
                finally:
                    proxy.stop()
                scope_entries = entries + stored
                index_kind = "hnsw" if scope_entries > index.hnsw_above else "flat"
                if result["semantic_hits"] < result["semantic_requests"] and index_kind == "hnsw":
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
        "entries": entries,
        "scope_entries": scope_entries,
        "index_kind": index_kind,
        "hnsw_above": index.hnsw_above,
        "threshold": threshold,
        "queries": queries,
        **result,
        "filler_s": round(fill_s, 2),
        "duration_s": round(time.perf_counter() - started_all, 2),
        "notes": notes,
    }


def _measure(
    proxy_url: str,
    backend_url: str,
    semantic_texts: list[tuple[int, str]],
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
        for seed, _, _ in SEED_QUESTIONS:
            sent = _post(client, chat, chat_body(seed))
            if sent.status != 200:
                raise RuntimeError(f"proxy answered {sent.status} while seeding")
            if sent.tier == "miss":
                miss_s.append(sent.elapsed_s)

        progress(f"proxy bench: {queries} exact repeats")
        exact_s: list[float] = []
        for i in range(queries):
            sent = _post(client, chat, chat_body(SEED_QUESTIONS[i % len(SEED_QUESTIONS)][0]))
            if sent.status == 200 and sent.tier == "exact":
                exact_s.append(sent.elapsed_s)

        progress(f"proxy bench: {len(semantic_texts)} semantic paraphrases")
        semantic_s: list[float] = []
        sims: list[float] = []
        correct = 0
        missed: list[str] = []
        for seed_index, text in semantic_texts:
            sent = _post(client, chat, chat_body(text), {"x-kvgate-cache-control": "no-store"})
            if sent.status == 200 and sent.tier == "semantic":
                semantic_s.append(sent.elapsed_s)
                if sent.similarity is not None:
                    sims.append(sent.similarity)
                answered = sent.content.split(": ", 1)[1] if ": " in sent.content else ""
                correct += seed_of.get(answered) == seed_index
            else:
                missed.append(text)

        progress(f"proxy bench: {queries} direct backend requests (HTTP floor)")
        direct_s: list[float] = []
        for i in range(WARMUP_REQUESTS + queries):
            sent = _post(client, f"{backend_url}{chat}", {"model": "fake", "messages": [{"role": "user", "content": f"direct {i}"}]})
            if sent.status == 200 and i >= WARMUP_REQUESTS:
                direct_s.append(sent.elapsed_s)

    miss_p50, miss_p99 = percentiles_ms(miss_s)
    exact_p50, exact_p99 = percentiles_ms(exact_s)
    sem_p50, sem_p99 = percentiles_ms(semantic_s)
    direct_p50, direct_p99 = percentiles_ms(direct_s)
    if missed:
        print(f"proxy bench: {len(missed)} paraphrase(s) missed, e.g. {missed[0]!r}", file=sys.stderr)
    fields = {
        "seeded": len(SEED_QUESTIONS),
        "seed_misses": len(miss_s),
        "miss_p50_ms": miss_p50,
        "miss_p99_ms": miss_p99,
        "exact_requests": queries,
        "exact_hits": len(exact_s),
        "exact_hit_p50_ms": exact_p50,
        "exact_hit_p99_ms": exact_p99,
        "semantic_requests": len(semantic_texts),
        "semantic_hits": len(semantic_s),
        "semantic_hits_correct": correct,
        "semantic_hit_p50_ms": sem_p50,
        "semantic_hit_p99_ms": sem_p99,
        "semantic_missed_examples": missed[:10],
        "semantic_similarity_min": round(min(sims), 4) if sims else None,
        "semantic_similarity_median": round(float(np.median(sims)), 4) if sims else None,
        "backend_direct_p50_ms": direct_p50,
        "backend_direct_p99_ms": direct_p99,
    }
    return fields, WARMUP_REQUESTS + len(miss_s)
