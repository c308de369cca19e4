"""What `Router.stats()` shows of each replica: health, load, what the prefix index holds of it
(and its bound: in approximate mode the engine's own size once it reported one), what its engine
said of itself and of its load, and in precise mode the checks against the engine and the KV tiers
it reads. The caller hands over the router's parts, with the load refreshed."""

from __future__ import annotations

from typing import Any, Sequence

from kvgate.index.kv.prefix import PrefixIndex
from kvgate.middleware.routing.base import ReplicaState
from kvgate.middleware.routing.engine_load import EngineLoad
from kvgate.middleware.routing.engines import EngineBook
from kvgate.middleware.routing.load_cost import LoadCost
from kvgate.middleware.routing.precise import PreciseRouting


def replica_stats(
    replicas: Sequence[ReplicaState],
    index: PrefixIndex,
    book: EngineBook,
    engine_load: EngineLoad,
    precise: PreciseRouting | None,
    load_cost: LoadCost,
) -> dict[str, Any]:
    checks = precise.stats() if precise is not None else {}
    out: dict[str, Any] = {}
    for r in replicas:
        out[r.name] = {
            "healthy": r.healthy,
            "in_flight": r.in_flight,
            "requests": r.requests,
            "pending_prefill_tokens": r.pending_prefill_tokens,
            "blocks": index.blocks(r.name),
            "capacity_blocks": index.capacity(r.name),
        }
        engine = book.describe(r.name)
        if engine is not None:
            out[r.name]["engine"] = engine
        if r.name in checks:
            out[r.name]["precise"] = checks[r.name]
        if (reading := engine_load.stats(r.name)) is not None:
            out[r.name]["engine_load"] = reading
        if precise is not None and (tiers := precise.tiers.readable(r.name)):
            # the KV tiers this replica's engine can load from (blocks each holds), and what a
            # loaded token costs in prefill tokens on this route (measured; 1 until then)
            out[r.name]["kv_tiers"] = {t: index.blocks(t) for t in sorted(tiers)}
            out[r.name]["load_cost"] = round(load_cost.value, 4)
    return out
