"""The replay of `kvgate bench trust` (tools/bench/trust.py): the stream through a fresh cache per
setting of the real pipeline, in front of a deterministic backend that answers each question with
its class's answer, and the counts of hits, wrong hits and backend calls that come out of it.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from typing import Any, Callable, Sequence

import numpy as np
from fastapi import FastAPI, Request

from kvgate.index.responses.trust import wilson_upper
from kvgate.tools.bench.trust_stream import Stream

MODEL = "trust-bench"


class TableEmbedder:
    """The real embedder's vectors of the stream's questions, looked up by text (computed once and
    cached on disk); any other text goes to the real embedder."""

    def __init__(self, real: Any, texts: Sequence[str], vectors: np.ndarray) -> None:
        self.name, self.dim, self._real = real.name, real.dim, real
        self._rows = {t: i for i, t in enumerate(texts)}
        self._vectors = vectors

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if all(t in self._rows for t in texts):
            return self._vectors[[self._rows[t] for t in texts]]
        return self._real.embed(list(texts))


def backend_app(answer_of: dict[str, str]) -> Any:
    """A deterministic OpenAI-compatible server: the last user turn's class answer; counts calls."""
    app = FastAPI()
    app.state.calls = 0

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        app.state.calls += 1
        question = next((m["content"] for m in reversed(body["messages"]) if m.get("role") == "user"), "")
        text = answer_of.get(question, "Unknown question")
        return {
            "id": f"chatcmpl-{app.state.calls}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
        }

    return app


def replay(
    stream: Stream,
    semantic: dict[str, Any],
    embedder: Any,
    api_base: str,
    app: Any,
    store: dict[str, Any] | None = None,
    embedder_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One setting: a fresh cache (a fresh dir, or `store` with its own key prefix), the whole
    stream; counts from the pipeline's answers. `embedder_config` is the config's `embedder:`
    (the vectors come from `embedder` either way; the config brings the tuned model's prior)."""
    from kvgate.middleware.answers import answer_text
    from kvgate.middleware.build import build_pipeline
    from kvgate.middleware.config import parse_config

    with tempfile.TemporaryDirectory(prefix="kvgate-trust-") as tmp:
        raw: dict[str, Any] = {
            "cache_dir": tmp,
            "routes": [
                {
                    "name": "trust",
                    "model": MODEL,
                    "ttl": None,
                    "semantic": semantic,
                    "backend": {"model": "openai/fake", "api_base": api_base, "api_key": "sk-fake"},
                }
            ],
        }
        if store is not None:
            raw["store"] = store
        if embedder_config:
            raw["embedder"] = embedder_config
        config = parse_config(raw)
        pipeline = build_pipeline(config, embedder=embedder)
        calls_before = app.state.calls
        hits = wrong = 0
        started = time.perf_counter()
        try:
            for question in stream.questions:
                result = pipeline.complete(
                    {"model": MODEL, "temperature": 0, "messages": [{"role": "user", "content": question}]}
                )
                if result.info.cache != "miss":
                    hits += 1
                    wrong += answer_text(result.response.model_dump()) != stream.answer_of[question]
                if pipeline.trust is not None:
                    pipeline.trust.drain()
        finally:
            pipeline.close()
    n = len(stream.questions)
    return {
        "hits": hits,
        "wrong_hits": wrong,
        "hit_rate": round(hits / n, 5),
        "error_rate": round(wrong / n, 5),
        "error_rate_ci_high": round(wilson_upper(wrong, n), 5),
        "precision": round(1 - wrong / hits, 4) if hits else None,
        "backend_calls": app.state.calls - calls_before,
        "seconds": round(time.perf_counter() - started, 1),
    }


def setting_store(kind: str, url: str | None, n: int) -> dict[str, Any] | None:
    """The `store:` of setting n: None (local dirs), or the run's Redis under a prefix of its own."""
    if kind == "local":
        return None
    return {"backend": "redis", "url": url, "key_prefix": f"kvgate-trust-{n}:", "follow_interval_s": 0.1}


def embedding_table(real: Any, texts: list[str], progress: Callable[[str], None]) -> tuple[TableEmbedder, str]:
    """`real`'s vectors of `texts` from the benchmark embedding cache (keyed by the embedder's
    identity, so a retrained model never reuses another's vectors)."""
    from kvgate.index.responses.embedder import embedder_identity
    from kvgate.tools.bench.embed_cache import cache_key, cached_embeddings

    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()
    vectors, cache = cached_embeddings(
        texts, real, cache_key(digest, f"{real.name}:{embedder_identity(real)}"), progress
    )
    table = TableEmbedder(real, texts, vectors)
    table.identity = embedder_identity(real)  # type: ignore[attr-defined]
    return table, cache.state


def sweep(
    stream: Stream,
    thresholds: Sequence[float],
    embedder: Any,
    api_base: str,
    app: Any,
    store: str,
    url: str | None,
    first: int,
    label: str,
    progress: Callable[[str], None],
) -> list[dict[str, Any]]:
    """The static threshold sweep: one fresh cache per threshold."""
    rows = []
    for n, t in enumerate(thresholds, start=first):
        row = {
            "threshold": t,
            **replay(stream, {"threshold": t}, embedder, api_base, app, setting_store(store, url, n)),
        }
        rows.append(row)
        progress(
            f"{label} static {t}: hit rate {row['hit_rate']:.4f}, wrong-hit rate {row['error_rate']:.4f} ({row['seconds']}s)"
        )
    return rows
