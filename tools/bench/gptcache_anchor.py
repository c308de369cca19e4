"""GPTCache as an anchor for the semantic benchmark: same embedder, GPTCache's own storage and lookup.

GPTCache (the `gptcache` package, 0.1.x) is set up the way its docs recommend for a similar-question
cache, except that its embedding function is kvgate's embedder, so the comparison measures the two
caches and not two models:

* scalar store: `CacheBase("sqlite")` in a temp dir (needs SQLAlchemy);
* vector store: `VectorBase("faiss", dimension=384, top_k=1)`, an `IDMap,Flat` index with METRIC_L2;
* evaluation: `SearchDistanceEvaluation()` (max_distance 4.0, positive=False);
* pre-processing: `get_prompt`, so `put(prompt, answer)` / `get(prompt)` from `gptcache.adapter.api`.

Threshold mapping (read off gptcache 0.1.44's source). FAISS `METRIC_L2` returns the *squared* L2
distance d. GPTCache normalises every vector before it stores or searches it, and kvgate's vectors
are unit length already, so d = |a - b|^2 = 2 - 2*cos(a, b). SearchDistanceEvaluation turns d into
rank = max_distance - clip(d, 0, max_distance), with range (0, max_distance). The adapter accepts an
answer when rank >= max_distance * similarity_threshold (cache_factor 1). So a hit means

    d <= max_distance * (1 - similarity_threshold)  <=>  cos >= 1 - max_distance * (1 - s) / 2,

and a cosine threshold t is matched exactly by s = 1 - 2 * (1 - t) / max_distance, which is
(1 + t) / 2 for the default max_distance 4 (t = 0.9 -> s = 0.95). See `gptcache_threshold`.

Two settings differ from GPTCache's defaults, both so that the measurement is of lookups only:
the data manager keeps every entry (`max_size` = number of entries; the default LRU of 1,000 would
evict most of the benchmark), and `Config(disable_report=True)` skips the report row GPTCache
otherwise writes to sqlite on every hit (this makes GPTCache's latency smaller, not larger).
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from kvgate.index.responses.embedder import Embedder

GPTCACHE_MAX_DISTANCE = 4.0  # SearchDistanceEvaluation's default
ANSWER_PREFIX = "kvgate-bench-pair:"
SQLITE_FILE = "sqlite.db"


def gptcache_threshold(cosine_threshold: float, max_distance: float = GPTCACHE_MAX_DISTANCE) -> float:
    """GPTCache `similarity_threshold` equivalent to `cosine >= cosine_threshold` (module docstring)."""
    if not 0.0 <= cosine_threshold <= 1.0:
        raise ValueError(f"cosine threshold must be in [0, 1], got {cosine_threshold}")
    value = 1.0 - 2.0 * (1.0 - cosine_threshold) / max_distance
    if not 0.0 <= value <= 1.0:
        raise ValueError(
            f"cosine threshold {cosine_threshold} has no GPTCache equivalent with max_distance {max_distance}"
        )
    return value


def answer_for(pair_index: int) -> str:
    """The answer stored for pair `pair_index`; `pair_of` reads the index back."""
    return f"{ANSWER_PREFIX}{pair_index}"


def pair_of(answer: Any) -> int | None:
    """Pair index carried by an answer GPTCache returned, or None for a miss / foreign answer."""
    if isinstance(answer, str) and answer.startswith(ANSWER_PREFIX):
        return int(answer[len(ANSWER_PREFIX) :])
    return None


class GptcacheEmbedding:
    """kvgate's embedder as GPTCache's `embedding_func`: text -> 1-D float32 vector of `dim`.

    An optional memo of precomputed vectors (by text) lets the bulk passes skip re-embedding; the
    latency pass clears it so every lookup pays for a real embedding. `embedded` and `memo_hits`
    count which path each call took.
    """

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.dimension = int(embedder.dim)
        self._memo: dict[str, np.ndarray] = {}
        self.embedded = 0
        self.memo_hits = 0

    def remember(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        """Memoise `vectors[i]` as the embedding of `texts[i]`."""
        for text, vec in zip(texts, vectors):
            self._memo[text] = np.ascontiguousarray(vec, dtype=np.float32)

    def forget(self) -> None:
        """Drop the memo: from now on every call runs the embedder."""
        self._memo.clear()

    def __call__(self, data: Any, **_: Any) -> np.ndarray:
        text = str(data)
        vec = self._memo.get(text)
        if vec is not None:
            self.memo_hits += 1
            return vec
        self.embedded += 1
        return np.ascontiguousarray(self.embedder.embed([text])[0], dtype=np.float32).reshape(self.dimension)


@dataclass
class AnchorRun:
    """What the GPTCache run produced, scored by the caller with the same code as kvgate's run."""

    similarity_threshold: float  # GPTCache's own threshold value
    max_distance: float
    returned: list[int | None]  # per pair: the pair index GPTCache answered with, None on a miss
    latencies_s: list[float]  # one `get` each, real embedding included
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class _ClosedDataManager:
    """Stands in for a closed data manager: `Cache.init` registers an atexit hook that closes
    (and so flushes to disk) whatever data manager the cache holds, and by exit our temp dir is gone."""

    def close(self) -> None:
        return None

    def flush(self) -> None:
        return None


def require_gptcache() -> str | None:
    """None when gptcache and its sqlite store can run, else the reason they cannot.

    Checked up front because GPTCache answers a missing optional dependency by running
    `pip install` itself, which a benchmark must never do.
    """
    for module, package in (("gptcache", "gptcache==0.1.44"), ("sqlalchemy", "sqlalchemy"), ("faiss", "faiss-cpu")):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install {package}); GPTCache's sqlite+faiss stores need it"
    return None


@contextmanager
def open_gptcache(
    embedding: GptcacheEmbedding,
    questions: Sequence[str],
    cosine_threshold: float,
    progress: Callable[[str], None] = lambda _msg: None,
) -> Iterator[tuple[Any, Path]]:
    """(a `gptcache.Cache` set up as the module docstring says, the path of its sqlite scalar store),
    in a temporary directory, holding `questions` (answer i for question i: `answer_for`); closed
    and removed on exit."""
    from gptcache import Cache, Config
    from gptcache.manager import CacheBase, VectorBase, get_data_manager
    from gptcache.processor.pre import get_prompt
    from gptcache.similarity_evaluation import SearchDistanceEvaluation

    with tempfile.TemporaryDirectory(prefix="kvgate-bench-gptcache-") as tmp:
        data_manager = get_data_manager(
            CacheBase("sqlite", sql_url=f"sqlite:///{Path(tmp) / SQLITE_FILE}"),
            VectorBase("faiss", dimension=embedding.dimension, top_k=1, index_path=str(Path(tmp) / "faiss.index")),
            max_size=len(questions) + 1,
        )
        cache = Cache()
        cache.init(
            pre_embedding_func=get_prompt,
            embedding_func=embedding,
            data_manager=data_manager,
            similarity_evaluation=SearchDistanceEvaluation(max_distance=GPTCACHE_MAX_DISTANCE),
            config=Config(similarity_threshold=gptcache_threshold(cosine_threshold), disable_report=True),
        )
        try:
            started = time.perf_counter()
            cache.import_data(list(questions), [answer_for(i) for i in range(len(questions))])
            progress(f"gptcache: imported {len(questions)} entries in {time.perf_counter() - started:.1f}s")
            yield cache, Path(tmp) / SQLITE_FILE
        finally:
            data_manager.close()
            cache.data_manager = _ClosedDataManager()  # type: ignore[assignment]


def run_gptcache(
    embedder: Embedder,
    questions: Sequence[str],
    queries: Sequence[str],
    question_vectors: np.ndarray,
    query_vectors: np.ndarray,
    cosine_threshold: float,
    latency_queries: int,
    warmup: Sequence[str],
    progress: Callable[[str], None] = lambda _msg: None,
) -> AnchorRun:
    """Store `questions` (answer i for question i) in GPTCache, then look up every query.

    The precision pass (all `queries`) and the import use the precomputed vectors through the memo;
    the latency pass runs the first `latency_queries` queries one at a time with a real embedding.
    """
    from gptcache.adapter.api import get

    threshold = gptcache_threshold(cosine_threshold)
    embedding = GptcacheEmbedding(embedder)
    embedding.remember(questions, question_vectors)
    embedding.remember(queries, query_vectors)
    with open_gptcache(embedding, questions, cosine_threshold, progress) as (cache, _):
        returned: list[int | None] = []
        started = time.perf_counter()
        for i, text in enumerate(queries):
            returned.append(pair_of(get(text, cache_obj=cache)))
            if (i + 1) % 2000 == 0:
                progress(f"gptcache: looked up {i + 1}/{len(queries)}")
        progress(f"gptcache: precision pass over {len(queries)} queries in {time.perf_counter() - started:.1f}s")
        memo_calls = embedding.memo_hits

        embedding.forget()
        for text in warmup:
            get(text, cache_obj=cache)
        latencies: list[float] = []
        for text in queries[:latency_queries]:
            t0 = time.perf_counter()
            get(text, cache_obj=cache)
            latencies.append(time.perf_counter() - t0)
        if embedding.memo_hits != memo_calls:  # the memo was cleared: this cannot happen
            print("gptcache anchor: latency pass used memoised vectors", file=sys.stderr)
    settings = {
        "scalar_store": "sqlite",
        "vector_store": "faiss IDMap,Flat METRIC_L2 (squared distance)",
        "evaluation": f"SearchDistanceEvaluation(max_distance={GPTCACHE_MAX_DISTANCE}, positive=False)",
        "top_k": 1,
        "max_size": len(questions) + 1,
        "disable_report": True,
        "embedding": f"kvgate {embedder.name} (dim {embedding.dimension})",
        "embedding_calls_real": embedding.embedded,
        "embedding_calls_memo": memo_calls,
    }
    notes = [
        f"gptcache similarity_threshold {threshold:.4f} == cosine {cosine_threshold}: "
        f"squared L2 d = 2 - 2cos on unit vectors; hit when d <= max_distance * (1 - s)",
        "gptcache import and precision pass used a memo of the same precomputed vectors as kvgate's run "
        "(no re-embedding); its latency pass embedded every query for real",
        "gptcache Config(disable_report=True): no per-hit report row write; max_size = entries so nothing is evicted",
    ]
    return AnchorRun(threshold, GPTCACHE_MAX_DISTANCE, returned, latencies, settings, notes)
