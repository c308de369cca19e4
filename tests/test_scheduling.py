"""The replica's job order: least prefill first, aged, stop sentinel first."""

from __future__ import annotations

import threading
import time

import pytest

from kvgate.engines.replica.scheduling import JobQueue, priority


def test_short_prefill_goes_first_ties_in_arrival_order() -> None:
    q: JobQueue[str] = JobQueue()
    q.put("cold-a", 900)
    q.put("warm", 30)
    q.put("cold-b", 900)
    assert [q.get(), q.get(), q.get()] == ["warm", "cold-a", "cold-b"]
    with pytest.raises(LookupError):
        q.get_nowait()


def test_waiting_earns_priority() -> None:
    q: JobQueue[str] = JobQueue(aging=1000.0)
    q.put("long", 100)
    time.sleep(0.15)  # 150 tokens of credit: now ahead of a fresh 60-token job
    q.put("short", 60)
    assert q.get() == "long"


def test_bound_on_being_passed_over() -> None:
    # a job of cost c that waited c/aging seconds longer is never behind a zero-cost job
    for c in (0, 10, 500, 4000):
        for w in (0.0, 0.5, 3.0):
            assert priority(c, w + c / 400.0) <= priority(0, w)


def test_stop_sentinel_first_and_get_blocks_until_put() -> None:
    q: JobQueue[str] = JobQueue()
    q.put("job", 0)
    q.put(None)
    assert q.get() is None and q.get() == "job"
    got: list[str | None] = []
    t = threading.Thread(target=lambda: got.append(q.get()))
    t.start()
    q.put("late", 5)
    t.join(5)
    assert got == ["late"] and len(q) == 0
