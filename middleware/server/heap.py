"""The serving process's garbage collector, set for a long-lived server (`kvgate serve`).

After start-up a proxy holds hundreds of thousands of objects that live as long as it does (LiteLLM and the
other imports, the pipeline, the config); each full collection walks all of them, and with
CPython's default thresholds a collection of the youngest generation runs every 700 net
allocations, a few times per request, so under load the collector spends a visible share of the
proxy's time walking objects that can never be freed. `settle_heap` moves what is alive
once the pipeline is up into the collector's permanent generation (`gc.freeze`, which the
CPython docs recommend for long-lived servers) and collects young objects less often. Reference
counting frees almost everything a request makes; the collector is only for cycles, which it
still finds, a little later.

Only the server's own process calls it: the SDK never changes how its host collects garbage.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000  # net allocations between collections of the youngest generation (CPython: 700)


def settle_heap() -> None:
    """Freeze what is alive now and space out young collections (older ones keep CPython's ratios).

    Invariant: objects made afterwards are collected as before, only less often; of those alive
    now, one that later becomes garbage in a reference cycle stays (they are the process's
    start-up objects: modules, the pipeline, the config)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
