"""A simulated LLM engine: a prefix (KV) cache over chained block hashes and a timing model.

No HTTP here (see kvgate.engines.sim.server for the server). One SimEngine is one replica.

Prompt → tokens → blocks
    Chat messages are rendered as a plain transcript, one segment per message and then the
    generation prompt (kvgate.index.kv.tokenizer.render_transcript; joined here by `render_transcript`):

        <|system|>\\nYou are terse.\\n<|user|>\\nHi\\n<|assistant|>\\n

    With tokenizer "text" every character (Unicode code point) is one token
    (kvgate.index.kv.hashing.text_tokens), so `block_size`, `capacity_tokens`, `prefill_tps`, `decode_tps`
    and the reported prompt/cached token counts all count *characters* (≈ 4 per real token):
    a benchmark that wants "10k real tokens/s" passes prefill_tps ≈ 40k. Blocks are hashed with
    kvgate.index.kv.hashing.block_hashes(tokens, block_size). A router computes the same hashes with
    kvgate.index.kv.prompt.PromptHasher(TextTokenizer(), block_size). Another tokenizer spec ("smollm2", a local HF directory) uses that model's chat
    template and ids instead; everything then counts real tokens.

Prefix cache (kvgate.engines.sim.prefix_cache.PrefixCache)
    An LRU set of block hashes holding at most capacity_tokens // block_size blocks. As in vLLM,
    a fully cached prompt still recomputes its last token, so at most
    (prompt_tokens - 1) // block_size blocks can match; cached_tokens = matched_blocks *
    block_size. Generated tokens are not cached (the simulated answer is filler that a replayed
    trace's next turn does not contain). Lookup and insert happen together at the moment a
    request's prefill STARTS (leaves the queue), so a queued request that shares a prefix with the
    one before it benefits from it.

Timing model (one replica)
    - Prefill is compute-bound and serialized: one FIFO prefill queue per replica. A request's
      prefill takes  overhead_s + (prompt_tokens - cached_tokens) / prefill_tps  seconds
      (overhead default 2 ms: scheduling, the first forward pass's fixed cost).
    - TTFT = queue wait + prefill; the first token is emitted when prefill ends.
    - completion_tokens = max_tokens (default 16); decode then takes
      completion_tokens / decode_tps  seconds after the first token, and runs concurrently with
      every other request's decode and with the next prefill (continuous batching
      approximation: per-token decode latency does not grow with the batch).
    - Rates are absolute: a benchmark that wants a faster or slower world scales them.
    Times come from an injectable clock and sleep (defaults: time.monotonic, asyncio.sleep), so
    tests can drive the engine on virtual time.

Events
    Optional callbacks, for a KV-event publisher (vLLM's BlockStored / BlockRemoved):
    on_stored(hashes, token_ids, parent) once per contiguous run of newly stored blocks —
    token_ids is the flat list of those blocks' tokens (len = len(hashes) * block_size) and parent
    the hash of the block before the run (None at the chain's start); on_removed(hashes) for
    evicted blocks; on reset(), on_cleared() (vLLM's AllBlocksCleared), or without it
    on_removed(every held block). Removals are reported before the stores of the same
    admission. Every block announced as stored is held until announced as removed or cleared,
    so a stored run's parent was always announced before. A callback that raises is logged and
    does not fail the request. Hashes are kvgate.index.kv.hashing's (seed "kvgate"), so a router's
    kvgate.index.kv.kv_events.EventApplier maps them one to one.

The engine is driven from one asyncio event loop at a time (the prefill lock is per loop).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence

from kvgate.engines.sim.base import (
    DEFAULT_MAX_TOKENS,
    ClearedCallback,
    Clock,
    EngineBase,
    PrefillInfo,
    RemovedCallback,
    SimRequest,
    Sleep,
    Step,
    StoredCallback,
    matchable,
)
from kvgate.engines.sim.prefix_cache import PrefixCache, consecutive_runs
from kvgate.index.kv.hashing import BlockHash
from kvgate.index.kv.tokenizer import ChatTokenizer
from kvgate.index.kv.tokenizer import render_transcript as _transcript_segments

__all__ = ["DEFAULT_OVERHEAD_S", "PrefixCache", "SimEngine", "render_transcript"]

DEFAULT_OVERHEAD_S = 0.002


def render_transcript(messages: Sequence[dict[str, Any]]) -> str:
    """The text the "text" tokenizer sees: for each message `<|{role}|>\\n{content}\\n`, then
    `<|assistant|>\\n` (list contents: their text parts joined by newlines). Routers hashing for
    a sim replica must render the same way (this function, or kvgate.index.kv.tokenizer.TextTokenizer)."""
    return "".join(_transcript_segments(messages))


@dataclass
class _Counters:
    requests: int = 0
    completed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    stored_blocks: int = 0
    evicted_blocks: int = 0
    prefill_busy_s: float = 0.0
    ttfts: list[float] = field(default_factory=list)  # engine-side TTFT of each request since reset


class SimEngine(EngineBase):
    """One simulated replica: PrefixCache + FIFO prefill queue + concurrent decode.

    Rates are in tokens per second of the configured tokenizer (characters for "text").
    """

    def __init__(
        self,
        capacity_tokens: int,
        block_size: int = 16,
        *,
        prefill_tps: float,
        decode_tps: float,
        tokenizer: str | ChatTokenizer = "text",
        overhead_s: float = DEFAULT_OVERHEAD_S,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        on_stored: StoredCallback | None = None,
        on_removed: RemovedCallback | None = None,
        on_cleared: ClearedCallback | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if overhead_s < 0:
            raise ValueError("overhead_s must be >= 0")
        self._setup(
            capacity_tokens,
            block_size,
            prefill_tps,
            decode_tps,
            tokenizer,
            default_max_tokens,
            on_stored,
            on_removed,
            on_cleared,
            clock,
            sleep,
        )
        self.overhead_s = float(overhead_s)
        self._cache = PrefixCache(capacity_tokens // block_size)
        self._counters = _Counters()
        self._queue_len = 0
        self._waiting: dict[object, SimRequest] = {}  # a key per queued request → the request
        self._running: tuple[int, float, float] | None = None  # (uncached tokens, started, prefill_s)
        self._in_flight = 0
        self._prefilling = 0
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None

    # -- requests -------------------------------------------------------------------------------

    def lookup(self, req: SimRequest) -> int:
        """Tokens that would be served from cache if req's prefill started now (no state change)."""
        return self._cache.match(matchable(req.hashes, req.prompt_tokens, self.block_size)) * self.block_size

    def prefill_seconds(self, prompt_tokens: int, cached_tokens: int) -> float:
        """The modelled prefill time: overhead + uncached tokens / prefill rate."""
        return self.overhead_s + max(0, prompt_tokens - cached_tokens) / self.prefill_tps

    def decode_seconds(self, completion_tokens: int) -> float:
        """The modelled decode time after the first token: completion_tokens / decode rate."""
        return completion_tokens / self.decode_tps

    async def generate(self, req: SimRequest, pieces: int = 1) -> AsyncIterator[Step]:
        """Queue, prefill, decode. Yields the first token at TTFT, then the remaining tokens in
        up to `pieces` steps evenly spread over the decode time; returns when decode ends.
        Cancelling while queued leaves the queue without touching the cache."""
        arrived = self._clock()
        self._counters.requests += 1
        self._in_flight += 1
        try:
            info = await self._prefill(req, arrived)
            self._counters.ttfts.append(info.ttft_s)
            n = req.completion_tokens
            yield Step(0, 1, info)
            decode_start, decode_s = self._clock(), self.decode_seconds(n)
            rest = n - 1
            parts = max(1, min(pieces, rest))
            done = 1
            for i in range(1, parts + 1):
                await self._sleep(max(0.0, decode_start + decode_s * i / parts - self._clock()))
                end = 1 + rest * i // parts
                if end > done:
                    yield Step(done, end, info)
                    done = end
            self._counters.completed += 1
        finally:
            self._in_flight -= 1

    # -- state ----------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Cumulative counters since start/reset, and the live queue and cache state."""
        c = self._counters
        return {
            "requests": c.requests,
            "completed": c.completed,
            "prompt_tokens": c.prompt_tokens,
            "cached_tokens": c.cached_tokens,
            "hit_rate": c.cached_tokens / c.prompt_tokens if c.prompt_tokens else 0.0,
            "stored_blocks": c.stored_blocks,
            "evicted_blocks": c.evicted_blocks,
            "blocks_held": len(self._cache),
            "capacity_blocks": self._cache.capacity_blocks,
            "block_size": self.block_size,
            "queue_len": self._queue_len,
            "prefilling": self._prefilling,
            "in_flight": self._in_flight,
            "prefill_busy_s": round(c.prefill_busy_s, 6),
            "queued_prefill_tokens": self.queued_prefill_tokens(),
            "sim_model": "fifo",
        }

    def queued_prefill_tokens(self) -> int:
        """Uncached prompt tokens not yet prefilled: queued requests (minus what the cache would
        give them now) and the unfinished part of the running prefill."""
        queued = sum(r.prompt_tokens - self.lookup(r) for r in self._waiting.values())
        if self._running is not None:
            uncached, started, prefill_s = self._running
            left = 1.0 - (self._clock() - started) / prefill_s if prefill_s > 0 else 0.0
            queued += int(uncached * min(1.0, max(0.0, left)))
        return queued

    def reset(self) -> None:
        """Empty the cache (reported through on_cleared, else on_removed) and zero the cumulative
        counters; live requests keep running and keep their queue/in-flight accounting."""
        held = self._cache.clear()
        if self.on_cleared is not None:
            self._emit(self.on_cleared)
        elif held:
            self._emit(self.on_removed, held)
        self._counters = _Counters()

    def held_hashes(self) -> list[BlockHash]:
        """Blocks in the cache, least recently used first."""
        return self._cache.hashes()

    # -- internals ------------------------------------------------------------------------------

    def _prefill_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop  # asyncio.Lock wakes waiters FIFO
        return self._lock

    async def _prefill(self, req: SimRequest, arrived: float) -> PrefillInfo:
        self._queue_len += 1
        key = object()
        self._waiting[key] = req
        queued = True
        try:
            async with self._prefill_lock():
                self._queue_len -= 1
                del self._waiting[key]
                queued = False
                started = self._clock()
                cached = self._admit(req)
                prefill_s = self.prefill_seconds(req.prompt_tokens, cached)
                self._prefilling += 1
                self._running = (req.prompt_tokens - cached, started, prefill_s)
                try:
                    await self._sleep(prefill_s)
                finally:
                    self._prefilling -= 1
                    self._running = None
                    self._counters.prefill_busy_s += prefill_s
        finally:
            if queued:
                self._queue_len -= 1
                self._waiting.pop(key, None)
        return PrefillInfo(
            prompt_tokens=req.prompt_tokens,
            cached_tokens=cached,
            queue_s=started - arrived,
            prefill_s=prefill_s,
            ttft_s=self._clock() - arrived,
        )

    def _admit(self, req: SimRequest) -> int:
        """Cache lookup + insert at prefill start; returns cached tokens and emits events."""
        cached = self._cache.match(matchable(req.hashes, req.prompt_tokens, self.block_size)) * self.block_size
        new, evicted = self._cache.insert(req.hashes)
        c = self._counters
        c.prompt_tokens += req.prompt_tokens
        c.cached_tokens += cached
        c.stored_blocks += len(new)
        c.evicted_blocks += len(evicted)
        if evicted:
            self._emit(self.on_removed, evicted)
        if new and self.on_stored is not None:
            bs = self.block_size
            for first, last in consecutive_runs(new):
                parent = req.hashes[first - 1] if first > 0 else None
                self._emit(
                    self.on_stored, req.hashes[first : last + 1], req.tokens[first * bs : (last + 1) * bs], parent
                )
        return cached
