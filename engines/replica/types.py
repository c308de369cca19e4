"""The replica engine's public types: what a caller passes in (SamplingParams), gets back
(Completion, the Event stream), holds (Submission, TokenStream), and the engine's own job record.

No torch and no model here: the HTTP face imports these names cheaply.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

from kvgate.engines.api import InvalidRequest

DEFAULT_MAX_TOKENS = 256
MAX_TOKENS_LIMIT = 4096  # per request; SmolLM2's context is 8192


@dataclass(frozen=True)
class SamplingParams:
    """How to decode. temperature None or 0 = greedy (the default); top_p in (0, 1]."""

    max_tokens: int | None = None  # None: DEFAULT_MAX_TOKENS, clipped to the context left
    temperature: float | None = None
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def validate(self) -> None:
        """Raise InvalidRequest naming the bad field."""
        if self.max_tokens is not None and not 1 <= self.max_tokens <= MAX_TOKENS_LIMIT:
            raise InvalidRequest(f"max_tokens must be between 1 and {MAX_TOKENS_LIMIT}", param="max_tokens")
        if self.temperature is not None and not 0 <= self.temperature <= 2:
            raise InvalidRequest("temperature must be between 0 and 2", param="temperature")
        if not 0 < self.top_p <= 1:
            raise InvalidRequest("top_p must be in (0, 1]", param="top_p")
        if len(self.stop) > 4 or any(not s for s in self.stop):
            raise InvalidRequest("stop must be at most 4 non-empty strings", param="stop")


@dataclass(frozen=True)
class Completion:
    """The outcome of one request. Times in seconds, measured; ttft_s counts from submission
    (queue wait included). finish_reason: "stop" (EOS or a stop string), "length" (max_tokens),
    "cancelled" (the caller went away)."""

    text: str
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    stored_chunks: int
    queue_s: float
    load_s: float
    prefill_s: float
    ttft_s: float
    decode_s: float
    store_s: float
    token_ids: tuple[int, ...] = ()  # the answer's ids, EOS excluded (stop-string text included)

    def usage(self) -> dict[str, Any]:
        """OpenAI usage object."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def timings(self) -> dict[str, float]:
        return {
            k: round(getattr(self, k), 6) for k in ("queue_s", "load_s", "prefill_s", "ttft_s", "decode_s", "store_s")
        }

    @staticmethod
    def cancelled_before_start(prompt_tokens: int, queue_s: float) -> Completion:
        """A request cancelled while it waited: nothing computed, nothing stored."""
        return Completion("", "cancelled", prompt_tokens, 0, 0, 0, queue_s, 0.0, 0.0, 0.0, 0.0, 0.0)


Event = str | Completion | BaseException  # what a job's sink receives: text pieces, then one end
Sink = Callable[[Event], None]


@dataclass
class Job:
    """A submitted request as the worker sees it."""

    tokens: list[int]
    params: SamplingParams
    max_tokens: int
    sink: Sink
    estimate: int = 0  # prompt tokens not in the store when submitted (scheduling key)
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class Counters:
    """The engine's cumulative counters (`requests` is written by callers under the scheduler's
    lock, the rest by the worker thread only)."""

    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    stored_chunks: int = 0
    prefill_s: float = 0.0
    load_s: float = 0.0


class Submission:
    """Handle on a submitted request; `cancel()` is safe from any thread, at any time."""

    def __init__(self, job: Job) -> None:
        self._job = job

    def cancel(self) -> None:
        self._job.cancelled.set()

    @property
    def prompt_tokens(self) -> int:
        return len(self._job.tokens)


class Submitter(Protocol):
    """What TokenStream needs of an engine."""

    def submit(self, tokens: list[int], params: SamplingParams, sink: Sink) -> Submission: ...


class TokenStream:
    """Blocking iterator over a request's text pieces; `completion` is set once exhausted.
    Closing it (or leaving a `with` block) early cancels the request."""

    def __init__(self, engine: Submitter, tokens: list[int], params: SamplingParams) -> None:
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.completion: Completion | None = None
        self._submission = engine.submit(tokens, params, self._events.put)

    def __iter__(self) -> Iterator[str]:
        while self.completion is None:
            ev = self._events.get()
            if isinstance(ev, Completion):
                self.completion = ev
            elif isinstance(ev, BaseException):
                raise ev
            else:
                yield ev

    def close(self) -> None:
        if self.completion is None:
            self._submission.cancel()

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
