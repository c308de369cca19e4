"""Group commit of the record steps that run on the event loop.

A small request's record step (the answer stored, its request-log record written) is a few
SQLite writes, and each commit (a journal sync) costs more than the writes in it.
Steps queued during one turn of the event loop run together at the start of the next turn,
inside one write batch (a transaction per store); each request waits for its own step, so the
answer is still stored before the client is told the response is complete.

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

Settle = Callable[[bool], None]
Step = tuple[Callable[..., Settle], tuple[Any, ...], "asyncio.Future[None]"]


class GroupCommit:
    """Runs `fn(*args)` for `run` callers in batches, one per event-loop turn, inside `batch()`."""

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
            loop.call_soon(self._flush, loop)
        queue.append((fn, args, future))
        await future

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
