"""Group commit of the record steps that run on the event loop.

A small request's record step (the answer stored, its request-log record written) is a few
SQLite writes, and each commit (its pages written to the journal) costs more than the writes in it.
Steps queued while the event loop turns run together in one write batch (a transaction per
store); each request waits for its own step, so the answer is still stored before the client is
told the response is complete.

When the batch runs: a lone step at the start of the next turn, as soon as it can; while steps
keep arriving (a turn added to the batch), one more turn, up to MAX_TURNS. An idle proxy's
request so waits no longer than before, and a busy one's at most a few turns (each a pass over
the sockets that were ready), in exchange for fewer, larger batches: a commit's cost is mostly
per batch (its transaction, the pages every commit writes), not per row.

A step returns a `Settle`: what to count once the batch's fate is known (`lost`: its commit
failed, so the writes the step made are gone).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from kvgate.index.storage.softfail import Batch

log = logging.getLogger("kvgate.pipeline")

MAX_TURNS = 4  # turns a batch may wait for more steps while they keep coming (docs/BENCHMARKS.md)
Settle = Callable[[bool], None]
Step = tuple[Callable[..., Settle], tuple[Any, ...], "asyncio.Future[None]"]


class GroupCommit:
    """Runs `fn(*args)` for `run` callers in batches inside `batch()`: a batch gathers steps from
    one event-loop turn, and from each next turn while that turn added some (MAX_TURNS at most)."""

    def __init__(self, batch: Callable[[], AbstractContextManager[Batch]]) -> None:
        self._batch = batch
        self._queues: dict[asyncio.AbstractEventLoop, list[Step]] = {}  # one per loop using this pipeline
        self.batches = 0  # flushes run, and steps in them: their ratio is the mean batch size
        self.steps = 0

    async def run(self, fn: Callable[..., Settle], *args: Any) -> None:
        """`fn(*args)` in the next batch of this loop; raises what it raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        queue = self._queues.setdefault(loop, [])
        if not queue:
            loop.call_soon(self._gather, loop, 1, 0)
        queue.append((fn, args, future))
        await future

    def _gather(self, loop: asyncio.AbstractEventLoop, seen: int, turns: int) -> None:
        """At a turn's start: wait one more turn if the last one added steps (`seen`: the queue's
        length then), else run the batch."""
        waiting = len(self._queues.get(loop, ()))
        if waiting > seen and turns < MAX_TURNS:
            loop.call_soon(self._gather, loop, waiting, turns + 1)
            return
        self._flush(loop)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        steps = self._queues.pop(loop, [])
        outcomes: list[BaseException | Settle | None] = [None] * len(steps)
        lost = False
        try:
            with self._batch() as batch:  # storage failures are the stores' to count: never raised here
                for i, (fn, args, _) in enumerate(steps):
                    try:
                        outcomes[i] = fn(*args)
                    except Exception as exc:  # the step's own: raised where its request waits
                        outcomes[i] = exc
            lost = batch.lost
        except Exception as exc:  # the batch itself broke: every waiting request hears of it
            outcomes = [o if isinstance(o, BaseException) else exc for o in outcomes]
        self.batches += 1
        self.steps += len(steps)
        for (_, _, future), outcome in zip(steps, outcomes):
            if callable(outcome):
                try:
                    outcome(lost)
                except Exception:  # counting must not fail a request that was served
                    log.exception("counting a stored answer failed")
            if future.done():  # its request was cancelled (the client left): the step ran all the same
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(None)
