"""Which request the replica's worker advances next: least prefill first, with aging.

`priority` is the rule; the engine applies it on every round to the requests it has started and
those waiting (kvgate.engines.replica.worker, "Scheduling"). JobQueue hands submitted requests to the
worker thread (the stop sentinel first) and orders them by the same rule when taken one by one.

Why: in arrival order, a next turn whose history is cached
(tens of tokens to prefill) waits behind every cold prompt queued before it (thousands each),
so the time a cache saves is lost in the queue. Ordering by the work a request needs before its
first token, minus credit for the time it has waited, lets short prefills through while bounding
how long a long one can be passed over.
"""

from __future__ import annotations

import threading
import time
from typing import Generic, TypeVar

T = TypeVar("T")

MAX_RUNNING = 8  # requests a replica interleaves (each holds its KV cache: ~46 KB per token for SmolLM2-135M)
AGING_TOKENS_PER_S = 400.0  # ~ what one CPU thread prefills per second for SmolLM2-135M


def priority(prefill_tokens: int, waited_s: float, aging: float = AGING_TOKENS_PER_S) -> float:
    """Lower runs first: prefill tokens still to compute, less `aging` tokens per second waited.

    Invariant (bounded unfairness): a job J of cost c runs before every job K that arrived
    c / aging seconds or more after it. At any moment K has waited w_K and J has waited at least
    w_K + c / aging, so priority(J) <= c - aging * (w_K + c / aging) = -aging * w_K <= priority(K)
    (costs are >= 0); ties go to the earlier arrival.
    """
    return prefill_tokens - aging * waited_s


class JobQueue(Generic[T]):
    """Thread-safe queue whose `get` returns the item of least `priority`; `None` items (the
    stop sentinel) are returned before anything else."""

    def __init__(self, aging: float = AGING_TOKENS_PER_S) -> None:
        self.aging = aging
        self._items: list[tuple[int, float, int, T | None]] = []  # (cost, arrived, seq, item)
        self._seq = 0
        self._cond = threading.Condition()

    def put(self, item: T | None, prefill_tokens: int = 0) -> None:
        with self._cond:
            self._items.append((prefill_tokens, time.monotonic(), self._seq, item))
            self._seq += 1
            self._cond.notify()

    def get(self) -> T | None:
        with self._cond:
            while not self._items:
                self._cond.wait()
            return self._pop()

    def get_nowait(self) -> T | None:
        """The next item; raises LookupError when empty."""
        with self._cond:
            if not self._items:
                raise LookupError("empty")
            return self._pop()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def _pop(self) -> T | None:
        now = time.monotonic()
        best = min(
            range(len(self._items)),
            key=lambda i: (
                self._items[i][3] is not None,  # the stop sentinel first
                priority(self._items[i][0], now - self._items[i][1], self.aging),
                self._items[i][2],  # ties: arrival order
            ),
        )
        return self._items.pop(best)[3]
