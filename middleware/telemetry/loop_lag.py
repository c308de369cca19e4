"""Event-loop lag: how late a sleeping task wakes up, sampled in the background.

Everything the proxy does for its requests shares one asyncio loop; a callback that runs for
20 ms delays every other request's next step by up to 20 ms. A task that asks to sleep `interval`
seconds and wakes `interval + lag` seconds later measures exactly that delay, whatever caused it
(CPU-bound work on the loop, a blocking call, or a CPU starved by other processes).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

DEFAULT_INTERVAL_S = 0.05


async def watch_loop_lag(
    observe: Callable[[float], None],
    interval: float = DEFAULT_INTERVAL_S,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Forever: sleep `interval`, report the oversleep (s, ≥ 0) to `observe`. Cancel to stop."""
    while True:
        asked = clock()
        await asyncio.sleep(interval)
        observe(max(0.0, clock() - asked - interval))
