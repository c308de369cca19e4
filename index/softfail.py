"""SoftFailures: storage operations that may fail without failing the request, counted and logged
once per streak.

A full disk or a damaged database makes every write fail the same way; one warning per streak
(and a note when it ends) tells the operator without flooding the log at request rate. The
counts are the figure to alert on.
"""
from __future__ import annotations

import logging
import threading


class SoftFailures:
    """Failure counts per operation ("store", "lookup"…); the first failure of an operation after
    it last worked is logged at WARNING, its next success at INFO."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self._what = what
        self._lock = threading.Lock()
        self._streaks: dict[str, int] = {}  # operations failing right now → failures in a row
        self.counts: dict[str, int] = {}

    def failed(self, op: str, exc: BaseException) -> None:
        with self._lock:
            self.counts[op] = self.counts.get(op, 0) + 1
            first = op not in self._streaks
            self._streaks[op] = self._streaks.get(op, 0) + 1
        if first:
            self._log.warning("%s: %s failed (%s: %s); the request goes on without it, further failures "
                              "are counted, not logged, until one succeeds", self._what, op, type(exc).__name__, exc)

    def succeeded(self, op: str) -> None:
        if op not in self._streaks:  # the common case: no lock
            return
        with self._lock:
            streak = self._streaks.pop(op, 0)
        if streak:
            self._log.info("%s: %s works again after %d failures", self._what, op, streak)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())
