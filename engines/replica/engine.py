"""ReplicaEngine: one CPU model behind a KV chunk store, requests interleaved step by step (no HTTP here).

Per request
    1. messages → the model's chat template → token ids, through index.tokenizer.HFChatTokenizer
       over the model's own tokenizer (segment by segment, as the router's PromptHasher does), so
       the ids are exactly the ones the router hashes.
    2. ids → chunk hashes (index.chunks.chunk_hashes, block size = chunk_tokens, no extra keys:
       with block_size = chunk_tokens they equal the router's index.hashing block hashes).
    3. store.longest_prefix → store.get_many → a transformers DynamicCache holding the loaded
       chunks' keys/values concatenated along the token axis.
    4. prefill ONLY the prompt tokens after the loaded ones, in slices (see Scheduling), then
       decode token by token with our own loop over the model (greedy by default; temperature /
       top_p sampling with an optional seed; max_tokens; stop strings; EOS).
    5. slice every full chunk of (prompt + answer) tokens out of the final cache that the store
       does not already have and put_many them; announce them through on_stored.

Invariants
- KV is position-dependent (keys are stored after RoPE), so a chunk is only valid at its
  absolute position. Chunk i's hash covers every token before its end, so a chunk found by the
  prefix walk sits at exactly the position it was computed at.
- At least one prompt token is always prefilled: loaded tokens are capped at
  len(prompt) - 1 rounded down to whole chunks (the model needs a new token to produce logits).
- Only tokens whose KV is in the cache are stored: the last sampled token (EOS, the
  max_tokens-th token, or one after a cancel) is never fed back, so it is not part of a chunk.
- Callers never touch the model: one worker thread owns it and every request's KV cache. A
  cancelled request stops within one step (or is skipped if it has not started) and still
  stores the full chunks it computed.
- With exact_prefill, a run that loads KV from the store computes bit for bit the logits of a
  cold run; without it they agree up to float rounding (~1e-5 in the logits), which in practice
  leaves greedy output unchanged. exact_prefill feeds the prompt in slices of exactly one chunk
  starting at a chunk boundary, so a cold run computes chunk i's KV, and every later slice, with
  the same forward shapes over the same inputs as a run that loads chunks 0..i-1.

Scheduling (the CPU analogue of chunked prefill with prefill priority)
    Up to max_running requests are started at once, each with its own KV cache. The worker loops:
    admit what was submitted; feed one prefill slice of the started-or-waiting request with the
    least remaining uncached prefill, aged (scheduling.priority: a request is passed over for at
    most its own prefill time); then advance every decoding request by one token. A slice is
    PREEMPT_SLICE tokens while anything else is started or waiting, so a cached next turn (tens
    of tokens to prefill) waits for at most one slice of someone's cold prompt or one round of
    decode steps, never for a whole cold prefill or answer; alone, a request is fed PREFILL_SLICE
    tokens per forward (bigger forwards are faster on the CPU: 2048 tokens in 128-token slices
    cost ~20% more than in one forward, in 512-token ~10%). The price of prefill priority on a
    CPU, which cannot batch the decode steps into the prefill forward as a GPU does: while a cold
    prompt is being prefilled, the requests already decoding advance one token per slice.

Events
    on_stored(hashes, token_ids, parent) follows vLLM's BlockStored with block_size =
    chunk_tokens: hashes of chunks newly held, token_ids their tokens (len = len(hashes) ·
    chunk_tokens), parent the hash before the first (None at the chain's start). "Newly" is per
    engine: a chunk another replica wrote to a shared disk tier, or one left from before a
    restart, is announced the first time this engine uses it, so an event's parent was always
    announced earlier by this engine (the router's EventApplier needs that to follow the chain).
    Eviction is not reported: ChunkStore tiers evict inside put() and do not say which keys went,
    so a router in precise mode may believe a replica holds chunks it evicted (it then pays a
    prefill, never gets wrong output); its own per-replica capacity bound ages them out.
    on_removed is accepted for symmetry with SimEngine and only called by `announce_cleared`.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from index.chunks import ChunkStore, KVChunk, chunk_hashes
from index.hashing import BlockHash
from index.prompt import PromptHasher
from index.tokenizer import HFChatTokenizer
from engines.api import InvalidRequest
from engines.replica.model import kv_geometry, model_namespace
from engines.replica.scheduling import MAX_RUNNING, JobQueue, priority
from engines.replica.tails import Tail, TailCache

log = logging.getLogger("kvgate.replica")

DEFAULT_MAX_TOKENS = 256
MAX_TOKENS_LIMIT = 4096  # per request; SmolLM2's context is 8192
PREFILL_SLICE = 512  # tokens per prefill forward when nothing else waits (whole chunks), unless exact_prefill
PREEMPT_SLICE = 128  # ... while other requests wait (at most one chunk), unless exact_prefill
ANNOUNCED_MEMORY = 1 << 16  # chunk hashes an engine remembers having announced

StoredCallback = Callable[[list[BlockHash], list[int], BlockHash | None], None]
RemovedCallback = Callable[[list[BlockHash]], None]


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
        return {k: round(getattr(self, k), 6) for k in ("queue_s", "load_s", "prefill_s", "ttft_s", "decode_s", "store_s")}


Event = str | Completion | BaseException  # what a job's sink receives: text pieces, then one end
Sink = Callable[[Event], None]


@dataclass
class _Job:
    tokens: list[int]
    params: SamplingParams
    max_tokens: int
    sink: Sink
    estimate: int = 0  # prompt tokens not in the store when submitted (scheduling key)
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Run:
    """A started request on the worker: its KV cache and how far it has got."""

    job: _Job
    started: float
    cache: Any
    loaded: int  # chunks loaded from the store
    cached: int  # prompt tokens whose KV was loaded (chunks + tail)
    pos: int  # next prompt token to feed
    load_s: float
    gen: torch.Generator | None
    detok: "_Detokenizer"
    stops: "_StopMatcher"
    prefill_s: float = 0.0
    decoding: bool = False  # the prompt is fed and the first token picked
    answer: list[int] = field(default_factory=list)
    finish: str = "length"
    ttft_s: float = 0.0
    t_decode: float = 0.0


class Ticket:
    """Handle on a submitted request; `cancel()` is safe from any thread, at any time."""

    def __init__(self, job: _Job) -> None:
        self._job = job

    def cancel(self) -> None:
        self._job.cancelled.set()

    @property
    def prompt_tokens(self) -> int:
        return len(self._job.tokens)


class TokenStream:
    """Blocking iterator over a request's text pieces; `completion` is set once exhausted.
    Closing it (or leaving a `with` block) early cancels the request."""

    def __init__(self, engine: "ReplicaEngine", tokens: list[int], params: SamplingParams) -> None:
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.completion: Completion | None = None
        self._ticket = engine.submit(tokens, params, self._events.put)

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
            self._ticket.cancel()

    def __enter__(self) -> "TokenStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Detokenizer:
    """Incremental ids → text (vLLM's prefix/read offsets): a piece is released only once it
    decodes without a trailing replacement character, so multi-byte characters are never split."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def add(self, token: int) -> str:
        self.ids.append(token)
        decode = self._tok.decode
        before = decode(self.ids[self._prefix : self._read], skip_special_tokens=True)
        after = decode(self.ids[self._prefix :], skip_special_tokens=True)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return after[len(before) :]
        return ""


class _StopMatcher:
    """Text so far, what may be released, and whether a stop string ended it. Released text
    never contains a stop string nor any part of one (a suffix that could begin one is held)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self._longest = max((len(s) for s in self.stops), default=0)
        self.text = ""
        self.released = 0
        self.stopped = False

    def feed(self, piece: str) -> str:
        """Add decoded text; returns the newly releasable part."""
        if self.stopped or not piece:
            return ""
        start = max(0, len(self.text) - self._longest + 1)
        self.text += piece
        if self.stops:
            hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
                return self.flush()
        safe = len(self.text) - self._held_back()
        out = self.text[self.released : safe]
        self.released = max(self.released, safe)
        return out

    def flush(self) -> str:
        out = self.text[self.released :]
        self.released = len(self.text)
        return out

    def _held_back(self) -> int:
        for n in range(min(self._longest - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0


@dataclass
class _Counters:
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
        self.on_stored = on_stored
        self.on_removed = on_removed
        self.default_max_tokens = default_max_tokens
        self.exact_prefill = exact_prefill
        self.prefill_slice = chunk_tokens if exact_prefill else max(chunk_tokens, PREFILL_SLICE // chunk_tokens * chunk_tokens)
        self.preempt_slice = chunk_tokens if exact_prefill else min(chunk_tokens, PREEMPT_SLICE)
        self.chat = HFChatTokenizer(tokenizer, self.namespace)
        self._hasher = PromptHasher(self.chat, chunk_tokens)  # for its segment-ids cache
        cfg = model.config
        self.context_tokens = int(getattr(cfg, "max_position_embeddings", 0) or 2048)
        self._n_layers, kv_heads, head_dim = kv_geometry(cfg)
        self._kv_shape = (kv_heads, chunk_tokens, head_dim)
        self._eos = self._eos_ids()
        # the partial chunk after the last full one, per conversation (RAM, spilled to the
        # store's slowest non-memory tier); off with exact_prefill, whose bit-exactness needs
        # chunk-aligned forwards
        spill = next((t for t in reversed(store.tiers) if t.name != "memory"), None) if store is not None else None
        self.tails = TailCache(0 if exact_prefill else tail_bytes, spill=spill, namespace=self.namespace)
        self._announced: OrderedDict[BlockHash, None] = OrderedDict()
        self._counters = _Counters()
        self._state = threading.Lock()  # guards _pending and requests (touched by callers)
        self._pending = 0
        self._running = 0  # started requests (written by the worker only)
        self._jobs: JobQueue[_Job] = JobQueue()  # least prefill first, with aging (scheduling.py)
        self._closed = False
        self._worker = threading.Thread(target=self._work, name="kvgate-replica-engine", daemon=True)
        self._worker.start()

    # -- public API -----------------------------------------------------------------------------

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

    def submit(self, tokens: list[int], params: SamplingParams, sink: Sink) -> Ticket:
        """Queue a prepared request. `sink` is called on the worker thread with each text piece,
        then exactly once with the Completion or an exception; it must not block for long."""
        if self._closed:
            raise RuntimeError("engine is closed")
        job = _Job(tokens=list(tokens), params=params, max_tokens=self._max_tokens(len(tokens), params), sink=sink,
                   estimate=self._prefill_estimate(list(tokens)))
        with self._state:
            self._pending += 1
            self._counters.requests += 1
        self._jobs.put(job, job.estimate)
        return Ticket(job)

    def stream(self, messages: Sequence[dict[str, Any]], params: SamplingParams | None = None, **kwargs: Any) -> TokenStream:
        """Text pieces as they are decoded (see TokenStream). kwargs build SamplingParams."""
        params = params or SamplingParams(**kwargs)
        return TokenStream(self, self.prepare(messages, params), params)

    def generate(self, messages: Sequence[dict[str, Any]], params: SamplingParams | None = None, **kwargs: Any) -> Completion:
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
            "requests": c.requests, "completed": c.completed, "cancelled": c.cancelled, "failed": c.failed,
            "prompt_tokens": c.prompt_tokens, "cached_tokens": c.cached_tokens,
            "hit_rate": c.cached_tokens / c.prompt_tokens if c.prompt_tokens else 0.0,
            "completion_tokens": c.completion_tokens, "stored_chunks": c.stored_chunks,
            "prefill_s": round(c.prefill_s, 6), "load_s": round(c.load_s, 6),
            "queue_len": max(0, self._pending - self._running), "running": self._running,
            "chunk_tokens": self.chunk_tokens, "namespace": self.namespace, "tails": self.tails.stats(),
        }
        if store and self.store is not None:
            out["store"] = self.store.stats()
        return out

    def announce_cleared(self) -> None:
        """Forget what was announced and report it removed (e.g. after store.clear())."""
        held = list(self._announced)
        self._announced.clear()
        if held:
            self._emit(self.on_removed, held)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the worker: started requests end as cancelled (their computed chunks are stored),
        queued ones get an error."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        self._worker.join(timeout)

    # -- worker ---------------------------------------------------------------------------------

    def _max_tokens(self, prompt_tokens: int, params: SamplingParams) -> int:
        room = self.context_tokens - prompt_tokens
        if room < 1:
            raise InvalidRequest(f"the prompt has {prompt_tokens} tokens; this model's context is {self.context_tokens}",
                             param="messages")
        if params.max_tokens is None:
            return min(self.default_max_tokens, room)
        if params.max_tokens > room:
            raise InvalidRequest(f"prompt ({prompt_tokens} tokens) + max_tokens ({params.max_tokens}) exceeds this "
                             f"model's context of {self.context_tokens} tokens", param="max_tokens")
        return params.max_tokens

    def _work(self) -> None:
        """The scheduling loop (see the module docstring): admit, one prefill slice for the most
        urgent prefilling request, one decode step per decoding request, repeat."""
        runs: list[_Run] = []
        waiting: list[tuple[_Job, int]] = []  # (job, estimated prefill tokens), not started yet
        while True:
            if self._admit(waiting, block=not runs and not waiting):
                break
            waiting = [w for w in waiting if not self._drop_if_cancelled(w[0])]
            decoding = [r for r in runs if r.decoding]
            pick = self._pick_prefill(runs, waiting)
            if isinstance(pick, _Job):
                waiting = [w for w in waiting if w[0] is not pick]
                pick = self._start(pick, runs)
            if pick is not None:
                contended = len(runs) > 1 or bool(waiting) or len(self._jobs) > 0
                self._step(runs, pick, lambda r: self._prefill_step(r, contended))
            for run in decoding:
                self._step(runs, run, self._decode_step)
        self._running = 0
        for run in list(runs):  # close(): what has started ends as cancelled, its computed chunks kept
            run.job.cancelled.set()
            self._step(runs, run, self._decode_step)
        leftovers = [job for job, _ in waiting]
        while True:
            try:
                job = self._jobs.get_nowait()
            except LookupError:
                break
            if job is not None:
                leftovers.append(job)
        for job in leftovers:  # whoever still waits gets an answer
            with self._state:
                self._pending -= 1
            self._deliver(job, RuntimeError("engine closed"))

    def _admit(self, waiting: list[tuple[_Job, int]], block: bool) -> bool:
        """Move submitted jobs into `waiting`; True when the stop sentinel came (close())."""
        first = True
        while True:
            try:
                job = self._jobs.get() if block and first else self._jobs.get_nowait()
            except LookupError:
                return False
            first = False
            if job is None:
                return True
            waiting.append((job, job.estimate))

    def _drop_if_cancelled(self, job: _Job) -> bool:
        """End a job cancelled before it started (nothing computed, nothing to store)."""
        if not job.cancelled.is_set():
            return False
        n = len(job.tokens)
        self._counters.cancelled += 1
        with self._state:
            self._pending -= 1
        self._deliver(job, Completion("", "cancelled", n, 0, 0, 0, time.perf_counter() - job.arrived,
                                      0.0, 0.0, 0.0, 0.0, 0.0))
        return True

    def _pick_prefill(self, runs: list["_Run"], waiting: list[tuple[_Job, int]]) -> "_Run | _Job | None":
        """The prefilling run or waiting job with the least aged remaining prefill
        (scheduling.priority, where waiting is time not spent on the request itself, so a
        running prompt does not earn credit for being computed); a waiting job only while fewer
        than max_running have started."""
        now = time.perf_counter()
        options: list[tuple[float, float, _Run | _Job]] = [
            (priority(len(r.job.tokens) - r.pos, now - r.job.arrived - r.load_s - r.prefill_s, self._jobs.aging),
             r.job.arrived, r)
            for r in runs if not r.decoding]
        if len(runs) < self.max_running:
            options += [(priority(est, now - job.arrived, self._jobs.aging), job.arrived, job) for job, est in waiting]
        if not options:
            return None
        return min(options, key=lambda o: (o[0], o[1]))[2]

    def _start(self, job: _Job, runs: list["_Run"]) -> "_Run | None":
        """Load the job's longest stored prefix and make it a run (None if loading failed)."""
        try:
            run = self._begin(job)
        except Exception as exc:
            self._fail(job, exc)
            return None
        runs.append(run)
        self._running = len(runs)
        return run

    def _step(self, runs: list["_Run"], run: "_Run", step: Callable[["_Run"], bool]) -> None:
        """Advance `run` by one step; when it is done, store its chunks and answer its caller."""
        try:
            done = step(run)
            result: Event | None = self._finish(run) if done else None
        except Exception as exc:  # report to the caller, keep serving the others
            done, result = True, exc
            log.exception("replica request failed")
            self._counters.failed += 1
        if not done:
            return
        runs.remove(run)
        self._running = len(runs)
        with self._state:
            self._pending -= 1
        assert result is not None
        self._deliver(run.job, result)

    def _fail(self, job: _Job, exc: Exception) -> None:
        log.error("replica request failed: %s", exc, exc_info=exc)
        self._counters.failed += 1
        with self._state:
            self._pending -= 1
        self._deliver(job, exc)

    @staticmethod
    def _deliver(job: _Job, result: Event) -> None:
        try:
            job.sink(result)
        except Exception:
            log.exception("replica result sink failed")

    def _begin(self, job: _Job) -> "_Run":
        """Load the longest stored prefix (never the whole prompt: one token must be fed)."""
        started = time.perf_counter()
        tokens, ct = job.tokens, self.chunk_tokens
        n = len(tokens)
        hashes = chunk_hashes(tokens, ct)
        cache, loaded = self._load(hashes[: (n - 1) // ct])
        cached = loaded * ct
        tail = self.tails.best(hashes[loaded - 1] if loaded else None, tokens[cached:], n - 1 - cached)
        if tail is not None:
            cache = self._extend(cache, tail)
            cached += len(tail.tokens)
        gen = None
        if job.params.temperature:
            gen = torch.Generator()
            gen.manual_seed(job.params.seed) if job.params.seed is not None else gen.seed()
        return _Run(job=job, started=started, cache=cache, loaded=loaded, cached=cached, pos=cached,
                    load_s=time.perf_counter() - started, gen=gen, detok=_Detokenizer(self.tokenizer),
                    stops=_StopMatcher(job.params.stop))

    def _prefill_step(self, run: "_Run", contended: bool) -> bool:
        """Feed the next slice of the prompt; after the last one, pick the first token. Slices are
        `preempt_slice` tokens while anything else is started or waiting, else `prefill_slice`.
        True when the run is done (cancelled, or a one-token answer)."""
        if run.job.cancelled.is_set():
            run.finish = "cancelled"
            return True
        step = self.preempt_slice if contended else self.prefill_slice
        tokens = run.job.tokens
        t0 = time.perf_counter()
        logits = self._forward(tokens[run.pos : run.pos + step], run.cache)
        run.pos = min(len(tokens), run.pos + step)
        run.prefill_s += time.perf_counter() - t0
        if run.pos < len(tokens):
            return False
        run.decoding = True
        run.t_decode = time.perf_counter()
        return self._accept(run, self._pick(logits, run.job.params, run.gen))

    def _decode_step(self, run: "_Run") -> bool:
        """Feed the last answer token and pick the next; True when the run is done."""
        if run.job.cancelled.is_set():
            run.finish = "cancelled"
            return True
        logits = self._forward([run.answer[-1]], run.cache)
        return self._accept(run, self._pick(logits, run.job.params, run.gen))

    def _accept(self, run: "_Run", token: int) -> bool:
        """Take a sampled token: EOS, stop string, max_tokens or a cancel end the run (the token
        that ends it is never fed back, so the cache holds KV for prompt + answer[:-1] at most)."""
        job = run.job
        if run.ttft_s == 0.0:
            run.ttft_s = time.perf_counter() - job.arrived
        if token in self._eos:
            run.finish = "stop"
            return True
        run.answer.append(token)
        piece = run.stops.feed(run.detok.add(token))
        if piece:
            job.sink(piece)
        if run.stops.stopped:
            run.finish = "stop"
        elif len(run.answer) >= job.max_tokens:
            run.finish = "length"
        elif job.cancelled.is_set():
            run.finish = "cancelled"
        else:
            return False
        return True

    def _finish(self, run: "_Run") -> Completion:
        """Store the new full chunks of prompt + answer, keep the partial one after them, count."""
        job, answer = run.job, run.answer
        tokens = job.tokens
        if run.decoding:
            rest = run.stops.flush()
            if rest and run.finish != "cancelled":
                job.sink(rest)
        decode_s = time.perf_counter() - run.t_decode if run.decoding else 0.0
        t0 = time.perf_counter()
        stored = self._store(tokens + answer, run.cache, run.loaded)
        self._keep_tail(tokens + answer, run.cache)
        store_s = time.perf_counter() - t0
        c = self._counters
        c.prompt_tokens += len(tokens)
        c.cached_tokens += run.cached
        c.completion_tokens += len(answer)
        c.prefill_s += run.prefill_s
        c.load_s += run.load_s
        if run.finish == "cancelled":
            c.cancelled += 1
        else:
            c.completed += 1
        return Completion(text=run.stops.text if run.decoding else "", finish_reason=run.finish,
                          prompt_tokens=len(tokens), cached_tokens=run.cached, completion_tokens=len(answer),
                          stored_chunks=stored, queue_s=run.started - job.arrived, load_s=run.load_s,
                          prefill_s=run.prefill_s, ttft_s=run.ttft_s, decode_s=decode_s, store_s=store_s,
                          token_ids=tuple(answer))

    def _prefill_estimate(self, tokens: list[int]) -> int:
        """Prompt tokens not covered by stored full chunks (the queue's ordering key; tails and
        chunks evicted before the job runs make it approximate, never wrong)."""
        n, ct = len(tokens), self.chunk_tokens
        if self.store is None or n <= ct:
            return n
        return n - self.store.longest_prefix(chunk_hashes(tokens, ct)[: (n - 1) // ct]) * ct

    def _load(self, hashes: list[BlockHash]) -> tuple[Any, int]:
        """(DynamicCache holding the longest loadable run of `hashes`, chunks loaded)."""
        from transformers import DynamicCache

        chunks: list[KVChunk] = []
        if self.store is not None and hashes:
            k = self.store.longest_prefix(hashes)
            chunks = self.store.get_many(hashes[:k]) if k else []
            bad = next((i for i, ch in enumerate(chunks) if not self._fits(ch)), None)
            if bad is not None:
                log.warning("KV chunk %d has the wrong shape for this model; using %d chunks", bad, bad)
                chunks = chunks[:bad]
        if not chunks:
            return DynamicCache(config=self.model.config), 0
        layers = [
            (torch.cat([ch[i][0] for ch in chunks], dim=1).unsqueeze(0),
             torch.cat([ch[i][1] for ch in chunks], dim=1).unsqueeze(0))
            for i in range(self._n_layers)
        ]
        return DynamicCache(layers, config=self.model.config), len(chunks)

    def _extend(self, cache: Any, tail: Tail) -> Any:
        """A DynamicCache holding `cache`'s KV followed by the tail's."""
        from transformers import DynamicCache

        if cache.get_seq_length() == 0:
            layers = [(k.clone(), v.clone()) for k, v in tail.layers]
        else:
            layers = [(torch.cat([layer.keys, k], dim=2), torch.cat([layer.values, v], dim=2))
                      for layer, (k, v) in zip(cache.layers, tail.layers)]
        return DynamicCache(layers, config=self.model.config)

    def _keep_tail(self, tokens: list[int], cache: Any) -> None:
        """Remember the KV after the last full chunk that `cache` holds (tokens it has KV for)."""
        if self.tails.budget_bytes <= 0:
            return
        ct, length = self.chunk_tokens, min(len(tokens), cache.get_seq_length())
        full = length // ct
        if length == full * ct:
            return
        parent = chunk_hashes(tokens[: full * ct], ct)[-1] if full else None
        layers = tuple((layer.keys[:, :, full * ct : length].clone(), layer.values[:, :, full * ct : length].clone())
                       for layer in cache.layers)
        self.tails.put(parent, Tail(tuple(tokens[full * ct : length]), layers))

    def _fits(self, chunk: KVChunk) -> bool:
        return len(chunk) == self._n_layers and all(
            tuple(k.shape) == self._kv_shape and tuple(v.shape) == self._kv_shape and k.dtype == self.model.dtype
            for k, v in chunk)

    def _forward(self, ids: list[int], cache: Any) -> torch.Tensor:
        """Feed `ids` after what `cache` holds (extending it in place); logits of the last one."""
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([ids], dtype=torch.long), past_key_values=cache,
                             use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]

    @staticmethod
    def _pick(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> int:
        if not params.temperature:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.float() / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            drop = torch.cumsum(sorted_p, dim=-1) - sorted_p >= params.top_p  # keeps at least one
            sorted_p[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        return int(torch.multinomial(probs, 1, generator=gen))

    def _store(self, tokens: list[int], cache: Any, loaded: int) -> int:
        """Put the full chunks held by `cache` beyond the first `loaded`; announce new ones."""
        ct = self.chunk_tokens
        n_full = min(len(tokens), cache.get_seq_length()) // ct
        if n_full == 0:
            return 0
        hashes = chunk_hashes(tokens[: n_full * ct], ct)
        stored = 0
        if self.store is not None and n_full > loaded:
            first = max(loaded, self.store.longest_prefix(hashes))
            if first < n_full:
                chunks = [
                    [(layer.keys[0, :, a : a + ct].contiguous(), layer.values[0, :, a : a + ct].contiguous())
                     for layer in cache.layers]
                    for a in range(first * ct, n_full * ct, ct)
                ]
                try:
                    stored = self.store.put_many(hashes[first:], chunks)
                except Exception:  # a failing store must not fail the request
                    log.exception("storing KV chunks failed")
            self._counters.stored_chunks += stored
        if self.store is not None:
            held = self.store.longest_prefix(hashes)  # what a tier refused is not announced
            self._announce(hashes[:held], tokens)
        return stored

    def _announce(self, hashes: list[BlockHash], tokens: list[int]) -> None:
        """on_stored for the chunks of this chain not announced before (see module docstring)."""
        if self.on_stored is None:
            return
        seen = 0
        while seen < len(hashes) and hashes[seen] in self._announced:
            self._announced.move_to_end(hashes[seen])
            seen += 1
        if seen == len(hashes):
            return
        new = hashes[seen:]
        ct = self.chunk_tokens
        for h in new:
            self._announced[h] = None
        while len(self._announced) > ANNOUNCED_MEMORY:
            self._announced.popitem(last=False)
        parent = hashes[seen - 1] if seen else None
        self._emit(self.on_stored, new, tokens[seen * ct : len(hashes) * ct], parent)

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for src in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            eos = getattr(src, "eos_token_id", None)
            if isinstance(eos, int):
                ids.add(eos)
            elif isinstance(eos, (list, tuple)):
                ids.update(int(e) for e in eos)
        return frozenset(ids)

    @staticmethod
    def _emit(callback: Callable[..., None] | None, *args: Any) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:  # a broken publisher must not fail the request
            log.exception("KV event callback failed")
