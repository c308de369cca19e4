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
    """Per-operation failure counts; the first failure after a success is logged at WARNING."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self._what = what
        self._lock = threading.Lock()
        self._failing = False
        self._streak = 0
        self.counts: dict[str, int] = {}

    def failed(self, op: str, exc: BaseException) -> None:
        with self._lock:
            self.counts[op] = self.counts.get(op, 0) + 1
            self._streak += 1
            first = not self._failing
            self._failing = True
        if first:
            self._log.warning("%s: %s failed (%s: %s); the request goes on without it, further failures "
                              "are counted, not logged, until one succeeds", self._what, op, type(exc).__name__, exc)

    def succeeded(self) -> None:
        if not self._failing:  # the common case: no lock
            return
        with self._lock:
            streak, self._failing, self._streak = self._streak, False, 0
        self._log.info("%s: storage works again after %d failed operations", self._what, streak)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())
