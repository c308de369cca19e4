"""ReplicaEngine: one CPU model behind a KV chunk store, requests interleaved step by step (no HTTP here).

Per request
    1. messages → the model's chat template → token ids, through kvgate.index.kv.tokenizer.HFChatTokenizer
       over the model's own tokenizer (segment by segment, as the router's PromptHasher does), so
       the ids are exactly the ones the router hashes.
    2. ids → chunk hashes (kvgate.index.kv.chunks.chunk_hashes, block size = chunk_tokens, no extra keys:
       with block_size = chunk_tokens they equal the router's kvgate.index.kv.hashing block hashes).
    3. store.longest_prefix → store.get_many → a transformers DynamicCache holding the loaded
       chunks' keys/values concatenated along the token axis, then the partial tail after them
       (kv_io.py, tails.py).
    4. prefill ONLY the prompt tokens after the loaded ones, in slices (worker.py, "Scheduling"),
       then decode token by token with our own loop over the model (runner.py; greedy by default,
       temperature / top_p sampling with an optional seed: sampling.py; max_tokens; stop strings:
       text.py; EOS).
    5. slice every full chunk of (prompt + answer) tokens out of the final cache that the store
       does not already have and put_many them (kv_io.py); announce them through on_stored
       (announce.py), and chunks the store loses from every tier through on_removed.

This module composes those parts and is the engine's public face: tokenize and validate
(`prepare`), queue (`submit`), iterate (`stream`), block (`generate`), count (`stats`). The
public types live in kvgate.engines.replica.types and are re-exported here.
"""

from __future__ import annotations

from typing import Any, Sequence

from kvgate.engines.api import InvalidRequest
from kvgate.engines.replica.announce import ANNOUNCED_MEMORY, Announcer, RemovedCallback, StoredCallback
from kvgate.engines.replica.kv_io import KVIO
from kvgate.engines.replica.model import model_namespace
from kvgate.engines.replica.runner import ModelRunner
from kvgate.engines.replica.scheduling import MAX_RUNNING
from kvgate.engines.replica.tails import TailCache
from kvgate.engines.replica.types import (
    DEFAULT_MAX_TOKENS,
    MAX_TOKENS_LIMIT,
    Completion,
    Counters,
    Event,
    Job,
    SamplingParams,
    Sink,
    Submission,
    TokenStream,
)
from kvgate.engines.replica.worker import PREEMPT_SLICE, PREFILL_SLICE, Worker
from kvgate.index.kv.chunks import ChunkStore
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import HFChatTokenizer

__all__ = [
    "ANNOUNCED_MEMORY",
    "DEFAULT_MAX_TOKENS",
    "MAX_TOKENS_LIMIT",
    "PREEMPT_SLICE",
    "PREFILL_SLICE",
    "Completion",
    "Event",
    "RemovedCallback",
    "ReplicaEngine",
    "SamplingParams",
    "Sink",
    "StoredCallback",
    "Submission",
    "TokenStream",
]


class ReplicaEngine:
    """A causal LM + an optional ChunkStore, serving chat requests interleaved step by step.

    `store` must use this engine's `namespace` (default model_namespace(model), e.g.
    "smollm2-135m:float32"): KV of another model or dtype must never be loaded.
    Call `close()` to stop the worker thread (pending requests end with an error).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        store: ChunkStore | None = None,
        chunk_tokens: int = 256,
        namespace: str | None = None,
        on_stored: StoredCallback | None = None,
        on_removed: RemovedCallback | None = None,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        exact_prefill: bool = False,
        tail_bytes: int = 256 << 20,
        max_running: int = MAX_RUNNING,
    ) -> None:
        if chunk_tokens <= 0:
            raise ValueError("chunk_tokens must be positive")
        if max_running < 1:
            raise ValueError("max_running must be >= 1")
        self.max_running = max_running
        self.model = model
        self.tokenizer = tokenizer
        self.namespace = namespace or model_namespace(model)
        if store is not None and store.namespace != self.namespace:
            raise ValueError(f"store namespace {store.namespace!r} is not this model's {self.namespace!r}")
        self.store = store
        self.chunk_tokens = chunk_tokens
        self.default_max_tokens = default_max_tokens
        self.exact_prefill = exact_prefill
        # exact_prefill's bit-exactness needs chunk-aligned forwards of one chunk (runner.py)
        self.prefill_slice = (
            chunk_tokens if exact_prefill else max(chunk_tokens, PREFILL_SLICE // chunk_tokens * chunk_tokens)
        )
        self.preempt_slice = chunk_tokens if exact_prefill else min(chunk_tokens, PREEMPT_SLICE)
        self.chat = HFChatTokenizer(tokenizer, self.namespace)
        self._hasher = PromptHasher(self.chat, chunk_tokens)  # for its segment-ids cache
        self.context_tokens = int(getattr(model.config, "max_position_embeddings", 0) or 2048)
        # the partial chunk after the last full one, per conversation (RAM, spilled to the
        # store's slowest non-memory tier); off with exact_prefill, whose bit-exactness needs
        # chunk-aligned forwards
        spill = next((t for t in reversed(store.tiers) if t.name != "memory"), None) if store is not None else None
        self.tails = TailCache(0 if exact_prefill else tail_bytes, spill=spill, namespace=self.namespace)
        self._announcer = Announcer(chunk_tokens, on_stored, on_removed)
        if store is not None and on_removed is not None:
            store.watch_removed(self._announcer.removed)  # chunks no tier holds any more
            store.watch_demoted(self._announcer.demoted)  # chunks only the remote tier holds
        self._kv = KVIO(model, store, chunk_tokens, self.tails)
        self._counters = Counters()
        runner = ModelRunner(
            model, tokenizer, self._kv, self._announcer, self._counters, self.prefill_slice, self.preempt_slice
        )
        self._closed = False
        self._worker = Worker(runner, self._counters, max_running)

    @property
    def on_stored(self) -> StoredCallback | None:
        return self._announcer.on_stored

    @property
    def on_removed(self) -> RemovedCallback | None:
        return self._announcer.on_removed

    def tokens(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Prompt token ids of a chat (chat template + generation prompt)."""
        return self._hasher.tokens(messages)

    def prepare(self, messages: Sequence[dict[str, Any]], params: SamplingParams) -> list[int]:
        """Tokenize and validate before queueing (so errors surface as 400s, not mid-stream)."""
        params.validate()
        if not messages:
            raise InvalidRequest("messages must be a non-empty list", param="messages")
        ids = self.tokens(messages)
        self._max_tokens(len(ids), params)
        return ids

    def submit(self, tokens: list[int], params: SamplingParams, sink: Sink) -> Submission:
        """Queue a prepared request. `sink` is called on the worker thread with each text piece,
        then exactly once with the Completion or an exception; it must not block for long."""
        if self._closed:
            raise RuntimeError("engine is closed")
        job = Job(
            tokens=list(tokens),
            params=params,
            max_tokens=self._max_tokens(len(tokens), params),
            sink=sink,
            estimate=self._kv.uncached_estimate(list(tokens)),
        )
        self._worker.submit(job)
        return Submission(job)

    def stream(
        self, messages: Sequence[dict[str, Any]], params: SamplingParams | None = None, **kwargs: Any
    ) -> TokenStream:
        """Text pieces as they are decoded (see TokenStream). kwargs build SamplingParams."""
        params = params or SamplingParams(**kwargs)
        return TokenStream(self, self.prepare(messages, params), params)

    def generate(
        self, messages: Sequence[dict[str, Any]], params: SamplingParams | None = None, **kwargs: Any
    ) -> Completion:
        """Blocking: the whole answer (Completion.text) with usage and timings."""
        with self.stream(messages, params, **kwargs) as s:
            for _ in s:
                pass
        assert s.completion is not None
        return s.completion

    def stats(self, store: bool = True) -> dict[str, Any]:
        """Cumulative counters, live queue state and (with `store`) the store's stats, which
        may read the disk tier's index."""
        c = self._counters
        out: dict[str, Any] = {
            "requests": c.requests,
            "completed": c.completed,
            "cancelled": c.cancelled,
            "failed": c.failed,
            "prompt_tokens": c.prompt_tokens,
            "cached_tokens": c.cached_tokens,
            "hit_rate": c.cached_tokens / c.prompt_tokens if c.prompt_tokens else 0.0,
            "completion_tokens": c.completion_tokens,
            "stored_chunks": c.stored_chunks,
            "prefill_s": round(c.prefill_s, 6),
            "load_s": round(c.load_s, 6),
            "queue_len": self._worker.queue_len,
            "running": self._worker.running,
            "chunk_tokens": self.chunk_tokens,
            "namespace": self.namespace,
            "tails": self.tails.stats(),
        }
        if store and self.store is not None:
            out["store"] = self.store.stats()
        return out

    def close(self, timeout: float = 30.0) -> None:
        """Stop the worker: started requests end as cancelled (their computed chunks are stored),
        queued ones get an error."""
        if self._closed:
            return
        self._closed = True
        self._worker.close(timeout)

    def _max_tokens(self, prompt_tokens: int, params: SamplingParams) -> int:
        """The request's answer budget: max_tokens, else the default, within the context left."""
        room = self.context_tokens - prompt_tokens
        if room < 1:
            raise InvalidRequest(
                f"the prompt has {prompt_tokens} tokens; this model's context is {self.context_tokens}",
                param="messages",
            )
        if params.max_tokens is None:
            return min(self.default_max_tokens, room)
        if params.max_tokens > room:
            raise InvalidRequest(
                f"prompt ({prompt_tokens} tokens) + max_tokens ({params.max_tokens}) exceeds this "
                f"model's context of {self.context_tokens} tokens",
                param="max_tokens",
            )
        return params.max_tokens
