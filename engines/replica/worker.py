"""The replica engine's worker thread: requests interleaved step by step on one model.

Scheduling (the CPU analogue of chunked prefill with prefill priority)
    Up to max_running requests are started at once, each with its own KV cache. The worker loops:
    admit what was submitted; feed one prefill slice of the started-or-waiting request with the
    least remaining uncached prefill, aged (scheduling.priority: a request is passed over for at
    most its own prefill time); then advance every decoding request by one token. A slice is
    PREEMPT_SLICE tokens while anything else is started or waiting, so a cached next turn (tens
    of tokens to prefill) waits for at most one slice of someone's cold prompt or one round of
    decode steps, never for a whole cold prefill or answer; alone, a request is fed PREFILL_SLICE
    tokens per forward (bigger forwards are faster on the CPU: the smaller the slices, the more a
    prompt costs in total). The price of prefill priority on a
    CPU, which cannot batch the decode steps into the prefill forward as a GPU does: while a cold
    prompt is being prefilled, the requests already decoding advance one token per slice.

Invariants
- Callers never touch the model: this one thread owns it and every request's KV cache.
- Every submitted job's sink gets exactly one end event (its Completion or an exception): a job
  cancelled before it started ends as "cancelled" without computing anything; one whose start
  or step raised gets the exception while the others keep being served; at close(), started
  runs end as cancelled (their computed chunks stored) and queued ones get an error.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Protocol

from kvgate.engines.replica.scheduling import JobQueue, priority
from kvgate.engines.replica.types import Completion, Counters, Event, Job

if TYPE_CHECKING:
    from kvgate.engines.replica.runner import Run

log = logging.getLogger("kvgate.replica")

PREFILL_SLICE = 512  # tokens per prefill forward when nothing else waits (whole chunks), unless exact_prefill
PREEMPT_SLICE = 128  # ... while other requests wait (at most one chunk), unless exact_prefill


class Runner(Protocol):
    """How a request's steps are taken (kvgate.engines.replica.runner.ModelRunner)."""

    def begin(self, job: Job) -> Run: ...

    def prefill_step(self, run: Run, contended: bool) -> bool: ...

    def decode_step(self, run: Run) -> bool: ...

    def finish(self, run: Run) -> Completion: ...

    def hold_background(self, held: bool) -> None: ...


class Worker:
    """Owns the queue of submitted jobs and the thread that runs them through `runner`."""

    def __init__(
        self, runner: Runner, counters: Counters, max_running: int, name: str = "kvgate-replica-engine"
    ) -> None:
        self.runner = runner
        self.counters = counters
        self.max_running = max_running
        self._state = threading.Lock()  # guards _pending and counters.requests (touched by callers)
        self._pending = 0
        self._running = 0  # started requests (written by the worker only)
        self._jobs: JobQueue[Job] = JobQueue()  # least prefill first, with aging (scheduling.py)
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue `job` (any thread)."""
        with self._state:
            self._pending += 1
            self.counters.requests += 1
        self._jobs.put(job, job.estimate)

    @property
    def running(self) -> int:
        return self._running

    @property
    def queue_len(self) -> int:
        return max(0, self._pending - self._running)

    def close(self, timeout: float) -> None:
        """Stop the loop (see the module docstring for what pending jobs get) and join the thread."""
        self._jobs.put(None)
        self._thread.join(timeout)

    def _work(self) -> None:
        """The scheduling loop (see the module docstring): admit, one prefill slice for the most
        urgent prefilling request, one decode step per decoding request, repeat."""
        runs: list[Run] = []
        waiting: list[tuple[Job, int]] = []  # (job, estimated prefill tokens), not started yet
        held = False  # the store's background copies wait while a prompt is being prefilled
        while True:
            if self._admit(waiting, block=not runs and not waiting):
                break
            waiting = [w for w in waiting if not self._drop_if_cancelled(w[0])]
            decoding = [r for r in runs if r.decoding]
            pick = self._pick_prefill(runs, waiting)
            if (pick is not None) != held:  # before a start: its load queues the copies
                held = pick is not None
                self.runner.hold_background(held)
            if isinstance(pick, Job):
                waiting = [w for w in waiting if w[0] is not pick]
                pick = self._start(pick, runs)
            if pick is not None:
                contended = len(runs) > 1 or bool(waiting) or len(self._jobs) > 0
                self._step(runs, pick, lambda r: self.runner.prefill_step(r, contended))
            for run in decoding:
                self._step(runs, run, self.runner.decode_step)
        self._running = 0
        self.runner.hold_background(False)
        for run in list(runs):  # close(): what has started ends as cancelled, its computed chunks kept
            run.job.cancelled.set()
            self._step(runs, run, self.runner.decode_step)
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

    def _admit(self, waiting: list[tuple[Job, int]], block: bool) -> bool:
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

    def _drop_if_cancelled(self, job: Job) -> bool:
        """End a job cancelled before it started (nothing computed, nothing to store)."""
        if not job.cancelled.is_set():
            return False
        self.counters.cancelled += 1
        with self._state:
            self._pending -= 1
        self._deliver(job, Completion.cancelled_before_start(len(job.tokens), time.perf_counter() - job.arrived))
        return True

    def _pick_prefill(self, runs: list[Run], waiting: list[tuple[Job, int]]) -> Run | Job | None:
        """The prefilling run or waiting job with the least aged remaining prefill
        (scheduling.priority, where waiting is time not spent on the request itself, so a
        running prompt does not earn credit for being computed); a waiting job only while fewer
        than max_running have started."""
        now = time.perf_counter()
        options: list[tuple[float, float, Run | Job]] = [
            (
                priority(len(r.job.tokens) - r.pos, now - r.job.arrived - r.load_s - r.prefill_s, self._jobs.aging),
                r.job.arrived,
                r,
            )
            for r in runs
            if not r.decoding
        ]
        if len(runs) < self.max_running:
            options += [(priority(est, now - job.arrived, self._jobs.aging), job.arrived, job) for job, est in waiting]
        if not options:
            return None
        return min(options, key=lambda o: (o[0], o[1]))[2]

    def _start(self, job: Job, runs: list[Run]) -> Run | None:
        """Load the job's longest stored prefix and make it a run (None if loading failed)."""
        try:
            run = self.runner.begin(job)
        except Exception as exc:
            self._fail(job, exc)
            return None
        runs.append(run)
        self._running = len(runs)
        return run

    def _step(self, runs: list[Run], run: Run, step: Callable[[Run], bool]) -> None:
        """Advance `run` by one step; when it is done, store its chunks and answer its caller."""
        try:
            done = step(run)
            result: Event | None = self.runner.finish(run) if done else None
        except Exception as exc:  # report to the caller, keep serving the others
            done, result = True, exc
            log.exception("replica request failed")
            self.counters.failed += 1
        if not done:
            return
        runs.remove(run)
        self._running = len(runs)
        with self._state:
            self._pending -= 1
        assert result is not None
        self._deliver(run.job, result)

    def _fail(self, job: Job, exc: Exception) -> None:
        log.error("replica request failed: %s", exc, exc_info=exc)
        self.counters.failed += 1
        with self._state:
            self._pending -= 1
        self._deliver(job, exc)

    @staticmethod
    def _deliver(job: Job, result: Event) -> None:
        try:
            job.sink(result)
        except Exception:
            log.exception("replica result sink failed")
