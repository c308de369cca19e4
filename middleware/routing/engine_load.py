"""What each replica's engine says of its own load and speed: its measured prefill rate and the
prefill work waiting in it, for the policies that time a request (prefill_time.py).

The proxy reads every replica's /metrics on one poller (kvgate.middleware.telemetry.replica_poll),
which hands each reading to its route's router as an `EngineReport`; nothing here does I/O.

- Prefill rate, per replica, calibrated online from the engine's own counters: over each interval
  between two reports, the tokens it computed in prefill (cached ones excluded) and the seconds its
  requests spent in prefill (vLLM: `vllm:request_prefill_kv_computed_tokens` and
  `vllm:request_prefill_time_seconds`, both counted as a request finishes); the rate is the ratio of
  their sums over the last WINDOW intervals that saw prefill (`fit_rate`). A replica with no such
  interval yet has none: the policy then uses the mean of its route's measured replicas, or its
  cold-start default while none is measured.
- Waiting work: the engine's `waiting` requests at the report, each counted as the mean prefill
  tokens per request measured the same way, drained at the measured rate as time passes since the
  report (`waiting_tokens`): the engine's own view between polls ages toward zero, while the
  router's exact count of the work it sent itself and not yet seen start (ReplicaState's
  `pending_prefill_tokens`) covers the requests it routes.

Invariants: `fit_rate` is pure, positive or None; `waiting_tokens` is pure, never negative and
never grows with time; a report whose counters went back (a restarted engine) counts from zero.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

WINDOW = 32  # intervals with prefill kept per replica (at the default 2 s poll: about a minute of work)
MIN_PREFILL_S = 0.05  # prefill seconds a window needs before its ratio is trusted


@dataclass(frozen=True)
class EngineReport:
    """One reading of a replica's engine (None: the engine does not export that number)."""

    running: float | None = None  # requests it is computing
    waiting: float | None = None  # requests queued in it
    prefill_tokens: float | None = None  # cumulative: tokens computed in prefill, cached ones excluded
    prefill_seconds: float | None = None  # cumulative: seconds requests spent in prefill
    prefill_requests: float | None = None  # cumulative: requests whose prefill those sums cover


def fit_rate(intervals: Iterable[tuple[float, float]]) -> float | None:
    """Prefill tokens per second from (tokens, seconds) intervals: Σ tokens / Σ seconds (pure);
    None when the seconds sum to less than MIN_PREFILL_S or no token was computed."""
    tokens = seconds = 0.0
    for t, s in intervals:
        tokens += t
        seconds += s
    if seconds < MIN_PREFILL_S or tokens <= 0:
        return None
    return tokens / seconds


def waiting_tokens(waiting: float, tokens_per_request: float | None, rate: float | None, elapsed_s: float) -> float:
    """Prefill tokens still waiting in an engine `elapsed_s` after it reported `waiting` requests
    (pure): waiting × tokens_per_request, less what `rate` computed since; 0 when either measure
    is missing."""
    if waiting <= 0 or not tokens_per_request or not rate:
        return 0.0
    return max(0.0, waiting * tokens_per_request - rate * max(0.0, elapsed_s))


def _gained(before: float | None, after: float | None) -> float:
    """A counter's growth; one that went back (its engine restarted) counts from zero."""
    if after is None:
        return 0.0
    before = before or 0.0
    return after - before if after >= before else after


class _Replica:
    def __init__(self) -> None:
        self.last: EngineReport | None = None
        self.at = 0.0
        self.intervals: deque[tuple[float, float, float]] = deque(maxlen=WINDOW)  # (tokens, seconds, requests)
        self.rate: float | None = None
        self.tokens_per_request: float | None = None


class EngineLoad:
    """Per replica of one route: the last report and what was calibrated from the reports so far
    (thread-safe: reports come from the poller's thread, views from the routing decision)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._replicas: dict[str, _Replica] = {}

    def report(self, replica: str, report: EngineReport, at: float | None = None) -> None:
        """A reading of `replica`'s engine taken at `at` (the router's clock; default now)."""
        at = self._clock() if at is None else at
        with self._lock:
            state = self._replicas.setdefault(replica, _Replica())
            last = state.last
            if last is not None and report.prefill_seconds is not None:
                seconds = _gained(last.prefill_seconds, report.prefill_seconds)
                if seconds > 0:
                    state.intervals.append(
                        (
                            _gained(last.prefill_tokens, report.prefill_tokens),
                            seconds,
                            _gained(last.prefill_requests, report.prefill_requests),
                        )
                    )
                    state.rate = fit_rate((t, s) for t, s, _ in state.intervals)
                    requests = sum(n for _, _, n in state.intervals)
                    state.tokens_per_request = (sum(t for t, _, _ in state.intervals) / requests) if requests else None
            state.last, state.at = report, at

    def forget(self, replica: str) -> None:
        """The replica left the route, or its engine is gone: what it said no longer holds."""
        with self._lock:
            self._replicas.pop(replica, None)

    def view(self, replica: str, now: float | None = None) -> tuple[float | None, float]:
        """(measured prefill rate or None, prefill tokens waiting in the engine now)."""
        now = self._clock() if now is None else now
        with self._lock:
            state = self._replicas.get(replica)
            if state is None or state.last is None:
                return None, 0.0
            waiting = waiting_tokens(state.last.waiting or 0.0, state.tokens_per_request, state.rate, now - state.at)
            return state.rate, waiting

    def stats(self, replica: str) -> dict[str, object] | None:
        """The last report's gauges and the calibration, for Router.stats (None: no report yet)."""
        with self._lock:
            state = self._replicas.get(replica)
            if state is None or state.last is None:
                return None
            return {
                "running": state.last.running,
                "waiting": state.last.waiting,
                "prefill_tokens_per_s": None if state.rate is None else round(state.rate, 1),
                "prefill_tokens_per_request": None
                if state.tokens_per_request is None
                else round(state.tokens_per_request, 1),
                "intervals": len(state.intervals),
            }
