"""Event-loop lag: how late a sleeping task wakes up, sampled in the background.

Everything the proxy does for its requests shares one asyncio loop; a callback that runs for
20 ms delays every other request's next step by up to 20 ms. A task that asks to sleep `interval`
seconds and wakes `interval + lag` seconds later measures exactly that delay, whatever caused it
(CPU-bound work on the loop, a blocking call, or a CPU starved by other processes).

The watcher samples every 250 ms while the proxy has requests in flight or admitted one within
the last second, and once a second otherwise. Each sample is a wake-up of the loop of its own,
and on a virtual machine a wake-up costs a measurable share of a core; the samples are taken at
times unrelated to the requests, so fewer of them still estimate the same distribution (how late
a timer set at a random moment runs), with a wider spread. A loop blocked while idle still shows,
as one late sample.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

DEFAULT_INTERVAL_S = 0.25
IDLE_INTERVAL_S = 1.0
IDLE_AFTER_S = 1.0  # no request in flight and none admitted for this long: the proxy is idle

# (requests in flight, requests admitted so far): the admission gate's counters
Activity = Callable[[], tuple[int, int]]


async def watch_loop_lag(
    observe: Callable[[float], None],
    interval: float = DEFAULT_INTERVAL_S,
    clock: Callable[[], float] = time.perf_counter,
    activity: Activity | None = None,
    idle_interval: float = IDLE_INTERVAL_S,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Forever: sleep, report the oversleep (s, ≥ 0) to `observe`. Cancel to stop. Without
    `activity` every sleep is `interval`; with it, `idle_interval` once nothing was in flight or
    admitted for IDLE_AFTER_S."""
    admitted, moved = -1, clock()
    while True:
        asked = clock()
        nap = interval
        if activity is not None:
            in_flight, now_admitted = activity()
            if in_flight or now_admitted != admitted:
                admitted, moved = now_admitted, asked
            elif asked - moved >= IDLE_AFTER_S:
                nap = idle_interval
        await sleep(nap)
        observe(max(0.0, clock() - asked - nap))
