"""BatchScheduler: the step planner of the batched simulator (`engines/sim/batched.py`), pure:
no clock, no asyncio; the engine plans a step, sleeps its duration, then commits it.

One step, like vLLM's scheduler with chunked prefill:
1. Every running request that has its first token and is still generating decodes ONE token
   (decode first: a running decode is never starved by prefill).
2. The rest of the step's token budget (`step_tokens`) goes to prefill chunks: first to running
   requests still prefilling, in admission order, then to waiting requests admitted in arrival
   order (FIFO) while running < `max_running`. A request's chunk is as much of its remaining
   prompt as the budget and the cache allow.
3. Step time = overhead_s + token_s · (decode tokens + prefill tokens).

Cache (kvgate.engines.sim.block_cache.BlockCache): at admission a request matches its longest cached
prefix (at most (prompt_tokens - 1) // block_size blocks: the last token is always computed, as
in vLLM) and pins it; that is its cached_tokens. As a chunk is scheduled, the full blocks it
completes are stored and pinned (as vLLM caches a block when it is scheduled full), so a request
admitted later in the same or a later step reuses them. A chunk stops short of a block that does
not fit (all other blocks pinned); a waiting request whose first chunk cannot progress is not
admitted (head-of-line, FIFO). If a step would do nothing at all, the oldest prefill goes ahead
past capacity (`force`) instead of deadlocking (`overcommits` counts it). A finished or aborted
request releases its blocks. Generated tokens take no cache blocks (as in kvgate.engines.sim.engine).

The first token comes at the end of the step that completes the prefill; then one token per
step. A request is "notified" at marks: its first token, the ends of its `pieces` stream pieces,
and its end. A step with no prefill may be planned as `steps` > 1 identical decode steps, up to
the next mark of any running request (nothing else can change before then; the engine commits
fewer if a new request arrives in between).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Deque

from kvgate.engines.sim.base import SimRequest, matchable
from kvgate.engines.sim.block_cache import BlockCache
from kvgate.index.kv.hashing import BlockHash


@dataclass(eq=False)
class Seq:
    """One request inside the scheduler."""

    req: SimRequest
    arrived: float
    pieces: int = 1
    epoch: int = 0
    cached: int = 0  # prompt tokens matched at admission
    computed: int = 0  # prompt tokens matched or computed so far
    pinned: int = 0  # leading blocks of req.hashes this request pins
    generated: int = 0  # answer tokens produced
    admitted_at: float | None = None
    first_at: float | None = None
    finished: bool = False
    marks: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.req.completion_tokens
        rest = n - 1
        parts = max(1, min(self.pieces, rest))
        self.marks = sorted({1, n, *(1 + rest * i // parts for i in range(1, parts + 1))})

    @property
    def prefilling(self) -> bool:
        return self.computed < self.req.prompt_tokens

    def next_mark(self) -> int:
        return next((m for m in self.marks if m > self.generated), self.req.completion_tokens)


@dataclass
class StepPlan:
    decodes: list[Seq]
    chunks: list[tuple[Seq, int]]
    steps: int
    step_s: float
    admitted: list[Seq] = field(default_factory=list)
    stored: list[tuple[SimRequest, list[int]]] = field(default_factory=list)  # (request, new block indices)
    evicted: list[BlockHash] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return len(self.decodes) + sum(c for _, c in self.chunks)


class BatchScheduler:
    """Waiting FIFO + running set + BlockCache; `plan` then `commit`, one step at a time."""

    def __init__(
        self,
        cache: BlockCache,
        block_size: int,
        *,
        step_tokens: int,
        overhead_s: float,
        token_s: float,
        max_running: int = 256,
    ) -> None:
        if step_tokens < 1 or max_running < 1 or overhead_s < 0 or token_s < 0:
            raise ValueError("step_tokens and max_running must be >= 1, overhead_s and token_s >= 0")
        self.cache = cache
        self.block_size = block_size
        self.step_tokens = step_tokens
        self.overhead_s = overhead_s
        self.token_s = token_s
        self.max_running = max_running
        self.waiting: Deque[Seq] = deque()
        self.running: list[Seq] = []
        self.epoch = 0
        self.overcommits = 0

    def add(self, seq: Seq) -> None:
        seq.epoch = self.epoch
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, seq: Seq) -> None:
        """Drop a request (client gone) wherever it is; its blocks are released."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
            self._release(seq)
        seq.finished = True

    def clear_cache(self) -> list[BlockHash]:
        """Empty the cache; requests admitted before no longer store or release blocks."""
        self.epoch += 1
        return self.cache.clear()

    # -- planning ---------------------------------------------------------------------------

    def plan(self, now: float) -> StepPlan | None:
        """The next step (None when there is nothing to do). Cache changes (admission pins,
        stored blocks, evictions) happen here and are listed in the plan for the engine's events."""
        if not self.has_work():
            return None
        plan = StepPlan(decodes=[], chunks=[], steps=1, step_s=0.0)
        budget = self.step_tokens
        plan.decodes = [s for s in self.running if not s.prefilling and s.generated < s.req.completion_tokens][:budget]
        budget -= len(plan.decodes)
        for s in self.running:
            if budget <= 0:
                break
            if s.prefilling:
                c = self._chunk(s, budget, plan, force=False)
                if c == 0:
                    break  # blocked on cache space: later prefills wait too (FIFO)
                budget -= c
        else:
            while budget > 0 and self.waiting and len(self.running) < self.max_running:
                s = self.waiting[0]
                self._admit(s, now)
                c = self._chunk(s, budget, plan, force=False)
                if c == 0:
                    self._release(s)
                    s.pinned = s.cached = s.computed = 0
                    s.admitted_at = None
                    break
                self.waiting.popleft()
                self.running.append(s)
                plan.admitted.append(s)
                budget -= c
        if not plan.decodes and not plan.chunks:
            self._force(plan, now)
        if not plan.chunks and plan.decodes:
            plan.steps = max(1, min(s.next_mark() - s.generated for s in plan.decodes))
        plan.step_s = self.overhead_s + self.token_s * plan.tokens
        return plan

    def _admit(self, s: Seq, now: float) -> None:
        bs = self.block_size
        n = self.cache.match(matchable(s.req.hashes, s.req.prompt_tokens, bs))
        self.cache.pin(s.req.hashes[:n])
        s.pinned, s.cached, s.computed, s.admitted_at = n, n * bs, n * bs, now

    def _chunk(self, s: Seq, budget: int, plan: StepPlan, force: bool) -> int:
        """Schedule up to `budget` prompt tokens of `s`, storing the blocks they complete; returns
        the tokens scheduled (0: the next block does not fit)."""
        bs, hashes = self.block_size, s.req.hashes
        c = min(s.req.prompt_tokens - s.computed, budget)
        if s.epoch != self.epoch:  # admitted before a reset: compute, store nothing
            plan.chunks.append((s, c))
            return c
        full = min(len(hashes), (s.computed + c) // bs)
        if full > s.pinned:
            fit = full if force else self.cache.fits(hashes, s.pinned, full)
            if fit < full:
                c = max(0, fit * bs - s.computed)
                if c == 0:
                    return 0
            new, evicted = self.cache.store(hashes, s.pinned, fit, force=force)
            s.pinned = fit
            plan.evicted.extend(evicted)
            if new:
                plan.stored.append((s.req, new))
        plan.chunks.append((s, c))
        return c

    def _force(self, plan: StepPlan, now: float) -> None:
        """Nothing could run: the oldest prefill goes ahead past capacity."""
        s = next((r for r in self.running if r.prefilling), None)
        if s is None and self.waiting and len(self.running) < self.max_running:
            s = self.waiting.popleft()
            self._admit(s, now)
            self.running.append(s)
            plan.admitted.append(s)
        if s is not None:
            self.overcommits += 1
            self._chunk(s, self.step_tokens, plan, force=True)

    # -- commit -----------------------------------------------------------------------------

    def commit(self, plan: StepPlan, now: float, steps: int | None = None) -> list[Seq]:
        """The step ended (`steps` of a multi-step decode plan, default all): advance tokens,
        finish requests, release their blocks. Returns the requests that reached a mark."""
        steps = plan.steps if steps is None else max(1, min(steps, plan.steps))
        marked: list[Seq] = []
        for s, c in plan.chunks:
            s.computed += c
            if not s.prefilling and s.generated == 0:
                s.generated, s.first_at = 1, now
                marked.append(s)
        for s in plan.decodes:
            before = s.generated
            s.generated = min(s.req.completion_tokens, s.generated + steps)
            if any(before < m <= s.generated for m in s.marks):
                marked.append(s)
        for s in [r for r in self.running if r.generated >= r.req.completion_tokens]:
            self.running.remove(s)
            self._release(s)
            s.finished = True
            if s not in marked:
                marked.append(s)
        return marked

    def _release(self, s: Seq) -> None:
        if s.epoch == self.epoch:
            self.cache.release(s.req.hashes[: s.pinned])
        s.pinned = 0

    def queued_prefill_tokens(self) -> int:
        """Uncached prompt tokens not yet computed: waiting requests (minus what the cache would
        give them now) and the rest of running prefills."""
        bs = self.block_size
        waiting = sum(
            s.req.prompt_tokens - bs * self.cache.match(matchable(s.req.hashes, s.req.prompt_tokens, bs))
            for s in self.waiting
        )
        return waiting + sum(s.req.prompt_tokens - s.computed for s in self.running if s.prefilling)
