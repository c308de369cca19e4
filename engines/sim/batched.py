"""BatchedEngine: the simulator's second timing model — continuous batching with a per-step
token budget and chunked prefill (vLLM's scheduler), over a block cache with pinning and
leaf-first LRU eviction. `kvgate sim-replica --sim-model batched` serves it; the HTTP face, the
usage / cached_tokens reporting and the KV events are those of kvgate.engines.sim.engine.SimEngine (the
"fifo" model), so a router cannot tell which model it talks to except by timing.

Model (the planner is kvgate.engines.sim.batch_scheduler, the cache kvgate.engines.sim.block_cache):
- One loop per replica runs steps back to back while there is work. Each step decodes one token
  for every running request past its first token, then fills the rest of `step_tokens` with
  prefill chunks (running prefills first, then waiting requests in arrival order).
- Step time = overhead_s + (decode + prefill tokens) / prefill_tps. With the default overhead,
  1/decode_tps − 1/prefill_tps, a lone request decodes at decode_tps; a step full of prefill runs
  at about prefill_tps. So decode slows down while prefills share the step, and a long prompt's
  prefill is spread over several steps during which others still decode — unlike the fifo model,
  where prefill is serialised per request and decode runs beside it at a fixed rate.
- TTFT = wait for admission + the steps until the prefill's last chunk ends.
- Tokens and rates count the tokenizer's tokens (characters for "text"; see kvgate.engines.sim.engine).

Events: on_stored(hashes, token_ids, parent) per contiguous run of newly stored blocks, at the
step that schedules them; on_removed(hashes) for evictions, reported before the same step's
stores; reset() reports on_cleared() (else on_removed(every held block)). Every block announced
stored is held until announced removed or cleared. A callback that raises is logged only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

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
from kvgate.engines.sim.batch_scheduler import BatchScheduler, Seq, StepPlan
from kvgate.engines.sim.block_cache import BlockCache
from kvgate.engines.sim.prefix_cache import consecutive_runs
from kvgate.index.kv.tokenizer import ChatTokenizer

__all__ = ["DEFAULT_STEP_TOKENS", "BatchedEngine"]

log = logging.getLogger("kvgate.sim")

DEFAULT_STEP_TOKENS = 2048
DEFAULT_MAX_RUNNING = 256


@dataclass
class _Counters:
    requests: int = 0
    completed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    stored_blocks: int = 0
    evicted_blocks: int = 0
    steps: int = 0
    busy_s: float = 0.0
    prefill_busy_s: float = 0.0
    ttfts: list[float] = field(default_factory=list)


class BatchedEngine(EngineBase):
    """One simulated replica with continuous batching; same public face as SimEngine."""

    def __init__(
        self,
        capacity_tokens: int,
        block_size: int = 16,
        *,
        prefill_tps: float,
        decode_tps: float,
        tokenizer: str | ChatTokenizer = "text",
        overhead_s: float | None = None,
        step_tokens: int = DEFAULT_STEP_TOKENS,
        max_running: int = DEFAULT_MAX_RUNNING,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        on_stored: StoredCallback | None = None,
        on_removed: RemovedCallback | None = None,
        on_cleared: ClearedCallback | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
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
        token_s = 1.0 / self.prefill_tps
        self.overhead_s = max(0.0, 1.0 / self.decode_tps - token_s) if overhead_s is None else float(overhead_s)
        self._cache = BlockCache(capacity_tokens // block_size)
        self._sched = BatchScheduler(
            self._cache,
            block_size,
            step_tokens=step_tokens,
            overhead_s=self.overhead_s,
            token_s=token_s,
            max_running=max_running,
        )
        self._counters = _Counters()
        self._events: dict[int, asyncio.Event] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def step_tokens(self) -> int:
        return self._sched.step_tokens

    # -- requests -------------------------------------------------------------------------------

    def lookup(self, req: SimRequest) -> int:
        """Tokens that would be served from cache if req were admitted now (no state change)."""
        return self._cache.match(matchable(req.hashes, req.prompt_tokens, self.block_size)) * self.block_size

    async def generate(self, req: SimRequest, pieces: int = 1) -> AsyncIterator[Step]:
        """Queue, prefill in chunks, decode one token per step. Yields the first token at TTFT,
        then the rest in up to `pieces` steps; returns at the last token. Cancelling releases the
        request's place and blocks."""
        seq = Seq(req, self._clock(), pieces=pieces)
        event = asyncio.Event()
        self._events[id(seq)] = event
        self._counters.requests += 1
        self._sched.add(seq)
        self._ensure_loop().set()
        done = 0
        try:
            while not seq.finished or seq.generated > done:
                await event.wait()
                event.clear()
                if seq.generated > done:
                    info = self._info(seq)
                    if done == 0:
                        self._counters.ttfts.append(info.ttft_s)
                    yield Step(done, seq.generated, info)
                    done = seq.generated
            self._counters.completed += 1
        finally:
            self._events.pop(id(seq), None)
            if not seq.finished:
                self._sched.abort(seq)

    # -- state ----------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Cumulative counters since start/reset, and the live queue and cache state (the keys of
        SimEngine.stats, plus the step counters)."""
        c, s = self._counters, self._sched
        prefilling = sum(1 for r in s.running if r.prefilling)
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
            "pinned_blocks": self._cache.pinned_blocks,
            "block_size": self.block_size,
            "queue_len": len(s.waiting),
            "prefilling": prefilling,
            "running": len(s.running),
            "in_flight": len(s.waiting) + len(s.running),
            "queued_prefill_tokens": s.queued_prefill_tokens(),
            "prefill_busy_s": round(c.prefill_busy_s, 6),
            "busy_s": round(c.busy_s, 6),
            "steps": c.steps,
            "step_tokens": s.step_tokens,
            "overcommits": s.overcommits,
            "sim_model": "batched",
        }

    def reset(self) -> None:
        """Empty the cache (reported through on_cleared, else on_removed) and zero the counters;
        running requests go on, but store and release no blocks."""
        held = self._sched.clear_cache()
        if self.on_cleared is not None:
            self._emit(self.on_cleared)
        elif held:
            self._emit(self.on_removed, held)
        self._counters = _Counters()

    def held_hashes(self) -> list:
        """Blocks in the cache, least recently used first."""
        return self._cache.hashes()

    # -- the step loop --------------------------------------------------------------------------

    def _info(self, seq: Seq) -> PrefillInfo:
        admitted = seq.admitted_at if seq.admitted_at is not None else seq.arrived
        first = seq.first_at if seq.first_at is not None else self._clock()
        return PrefillInfo(
            prompt_tokens=seq.req.prompt_tokens,
            cached_tokens=seq.cached,
            queue_s=admitted - seq.arrived,
            prefill_s=first - admitted,
            ttft_s=first - seq.arrived,
        )

    def _ensure_loop(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._loop is not loop:
            self._loop, self._wake = loop, asyncio.Event()
            self._task = loop.create_task(self._run())
            self._task.add_done_callback(_log_crash)
        assert self._wake is not None
        return self._wake

    async def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        while True:
            plan = self._sched.plan(self._clock())
            if plan is None:
                wake.clear()
                await wake.wait()
                continue
            self._account(plan)
            start = self._clock()
            steps = plan.steps
            if steps == 1:
                await self._sleep(plan.step_s)
            else:  # a run of decode-only steps, cut short at the next step boundary if a request arrives
                wake.clear()
                try:
                    await asyncio.wait_for(wake.wait(), plan.step_s * steps)
                    steps = min(steps, math.floor((self._clock() - start) / plan.step_s) + 1) if plan.step_s > 0 else 1
                    await self._sleep(max(0.0, start + steps * plan.step_s - self._clock()))
                except asyncio.TimeoutError:
                    pass
            c = self._counters
            c.steps += steps
            c.busy_s += plan.step_s * steps
            if plan.chunks:
                c.prefill_busy_s += plan.step_s
            for seq in self._sched.commit(plan, self._clock(), steps):
                ev = self._events.get(id(seq))
                if ev is not None:
                    ev.set()

    def _account(self, plan: StepPlan) -> None:
        c = self._counters
        for seq in plan.admitted:
            c.prompt_tokens += seq.req.prompt_tokens
            c.cached_tokens += seq.cached
        c.evicted_blocks += len(plan.evicted)
        if plan.evicted:
            self._emit(self.on_removed, list(plan.evicted))
        bs = self.block_size
        for req, new in plan.stored:
            c.stored_blocks += len(new)
            if self.on_stored is None:
                continue
            for first, last in consecutive_runs(new):
                parent = req.hashes[first - 1] if first > 0 else None
                self._emit(
                    self.on_stored, req.hashes[first : last + 1], req.tokens[first * bs : (last + 1) * bs], parent
                )


def _log_crash(task: "asyncio.Task[None]") -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("batched sim step loop crashed", exc_info=task.exception())
