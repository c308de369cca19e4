"""SoftFailures: storage operations that may fail without failing the request, counted and logged
once per streak.

A full disk or a damaged database makes every write fail the same way; one warning per streak
(and a note when it ends) tells the operator without flooding the log at request rate. The
counts are the figure to alert on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any


class SoftFailures:
    """Failure counts per operation ("store", "lookup"…); the first failure of an operation after
    it last worked is logged at WARNING, its next success at INFO."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self._what = what
        self._lock = threading.Lock()
        self._streaks: dict[str, int] = {}  # operations failing right now → failures in a row
        self._held: set[str] = set()  # operations inside a transaction: a success waits for its commit
        self.counts: dict[str, int] = {}

    def failed(self, op: str, exc: BaseException) -> None:
        with self._lock:
            self.counts[op] = self.counts.get(op, 0) + 1
            first = op not in self._streaks
            self._streaks[op] = self._streaks.get(op, 0) + 1
        if first:
            self._log.warning(
                "%s: %s failed (%s: %s); the request goes on without it, further failures are counted, not logged, until one succeeds",
                self._what,
                op,
                type(exc).__name__,
                exc,
            )

    def succeeded(self, op: str) -> None:
        if op not in self._streaks:  # the common case: no lock
            return
        with self._lock:
            if op in self._held:  # a write inside a transaction has not worked until it commits
                return
            streak = self._streaks.pop(op, 0)
        if streak:
            self._log.info("%s: %s works again after %d failures", self._what, op, streak)

    @contextlib.contextmanager
    def holding(self, op: str) -> Iterator[None]:
        """Successes of `op` inside are reported at the end, by `succeeded` or `failed` there."""
        with self._lock:
            self._held.add(op)
        try:
            yield
        finally:
            with self._lock:
                self._held.discard(op)

    def failures(self, op: str) -> int:
        """How many times `op` has failed so far."""
        with self._lock:
            return self.counts.get(op, 0)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())


@dataclass
class Batch:
    """What became of a transaction's writes: `lost` when its commit failed."""

    lost: bool = False


@contextlib.contextmanager
def soft_transaction(
    begin: Callable[[], AbstractContextManager[Any]],
    soft: SoftFailures,
    op: str,
    failures: tuple[type[BaseException], ...],
) -> Iterator[Batch]:
    """The body inside one transaction of a store (`begin()`), where a failure to begin or to
    commit is counted as `op` and never raised: without a transaction each write commits on its
    own; a failed commit loses the body's writes (`Batch.lost`), as a failed write would have
    lost its own, and the writes' successes are reported only once the commit worked, and only
    when no write of `op` failed meanwhile. An exception from the body rolls the transaction
    back and goes on."""
    stack, batch = contextlib.ExitStack(), Batch()
    try:
        stack.enter_context(begin())
    except failures as exc:
        soft.failed(op, exc)
        yield batch  # each write commits, and reports, on its own
        return
    failed_before = soft.failures(op)
    try:
        with soft.holding(op):
            yield batch
    except BaseException as exc:
        stack.__exit__(type(exc), exc, exc.__traceback__)
        raise
    try:
        stack.close()
    except failures as exc:
        batch.lost = True
        soft.failed(op, exc)
        return
    if soft.failures(op) == failed_before:  # a write that failed inside (a full disk) is no recovery
        soft.succeeded(op)
