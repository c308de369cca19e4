"""What the simulator's two timing models (kvgate.engines.sim.engine.SimEngine, the fifo model, and
kvgate.engines.sim.batched.BatchedEngine) share: a request as the engine sees it (SimRequest), what
its prefill did (PrefillInfo) and the answer's steps (Step), the rule of which blocks a prefix cache
may serve (`matchable`), the KV-event callback and clock types, and EngineBase (tokenize and hash a
chat, run a request to the end, check the common arguments, call the KV-event callbacks)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from kvgate.index.kv.hashing import BlockHash
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import ChatTokenizer, load_tokenizer

log = logging.getLogger("kvgate.sim")

DEFAULT_MAX_TOKENS = 16

StoredCallback = Callable[[list[BlockHash], list[int], BlockHash | None], None]
RemovedCallback = Callable[[list[BlockHash]], None]
ClearedCallback = Callable[[], None]
Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[Any]]


def matchable(hashes: Sequence[BlockHash], prompt_tokens: int, block_size: int) -> Sequence[BlockHash]:
    """The blocks of a prompt that a prefix cache may serve (pure). Invariant: at most
    (prompt_tokens − 1) // block_size of them, since vLLM recomputes the last prompt token even
    on a full hit, so it never comes from cache."""
    return hashes[: max(0, prompt_tokens - 1) // block_size]


@dataclass(frozen=True)
class SimRequest:
    """A prompt as the engine sees it: token ids, their full-block hashes, the answer length."""

    tokens: list[int]
    hashes: list[BlockHash]
    completion_tokens: int

    @property
    def prompt_tokens(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class PrefillInfo:
    """What happened to one request's prefill. queue_s and ttft_s are measured on the engine's
    clock; prefill_s is the modelled duration."""

    prompt_tokens: int
    cached_tokens: int
    queue_s: float
    prefill_s: float
    ttft_s: float


@dataclass(frozen=True)
class Step:
    """Tokens [start, end) of the answer became available. The first step arrives at TTFT with
    the first token (start == 0, end == 1); later steps spread the rest over the decode time."""

    start: int
    end: int
    prefill: PrefillInfo

    @property
    def first(self) -> bool:
        return self.start == 0


class EngineBase:
    """What both timing models (SimEngine, kvgate.engines.sim.batched.BatchedEngine) do alike: turn a chat
    into a SimRequest, run one to the end, report engine-side TTFTs, call KV-event callbacks.
    A subclass sets `_hasher`, `default_max_tokens`, `_counters.ttfts` and `generate`."""

    _hasher: PromptHasher
    default_max_tokens: int
    _counters: Any  # a subclass's counters; EngineBase reads only `.ttfts`

    def request(self, messages: Sequence[dict[str, Any]], max_tokens: int | None = None) -> SimRequest:
        """Tokenize and hash a chat prompt. completion_tokens = max_tokens (default 16), >= 1."""
        tokens = self._hasher.tokens(messages)
        hashes, _ = self._hasher.hashes(messages)
        n = self.default_max_tokens if max_tokens is None else max_tokens
        return SimRequest(tokens=tokens, hashes=hashes, completion_tokens=max(1, int(n)))

    async def complete(self, req: SimRequest) -> PrefillInfo:
        """Run a request to the end (non-streaming); returns its prefill info."""
        info: PrefillInfo | None = None
        steps = self.generate(req)
        try:
            async for step in steps:
                info = step.prefill
        finally:
            await steps.aclose()
        assert info is not None
        return info

    def ttfts(self) -> list[float]:
        """Engine-side TTFT (arrival at the engine → first token) of each request since reset."""
        return list(self._counters.ttfts)

    def _setup(
        self,
        capacity_tokens: int,
        block_size: int,
        prefill_tps: float,
        decode_tps: float,
        tokenizer: str | ChatTokenizer,
        default_max_tokens: int,
        on_stored: StoredCallback | None,
        on_removed: RemovedCallback | None,
        on_cleared: ClearedCallback | None,
        clock: Clock,
        sleep: Sleep,
    ) -> None:
        """Check and keep what both timing models take alike (geometry, rates, tokenizer,
        KV-event callbacks, clock); a ValueError names the bad argument."""
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        if prefill_tps <= 0 or decode_tps <= 0:
            raise ValueError("prefill_tps and decode_tps must be positive")
        if capacity_tokens < 0:
            raise ValueError("capacity_tokens must be >= 0")
        self.block_size = block_size
        self.capacity_tokens = capacity_tokens
        self.prefill_tps = float(prefill_tps)
        self.decode_tps = float(decode_tps)
        self.default_max_tokens = default_max_tokens
        self.tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self.on_stored, self.on_removed, self.on_cleared = on_stored, on_removed, on_cleared
        self._hasher = PromptHasher(self.tokenizer, block_size)
        self._clock, self._sleep = clock, sleep

    @staticmethod
    def _emit(callback: Callable[..., None] | None, *args: Any) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:  # a broken publisher must not fail the simulated request
            log.exception("KV event callback failed")
