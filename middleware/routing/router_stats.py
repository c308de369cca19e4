"""What `Router.stats()` shows of each replica: health, load, what the prefix index holds of it
(and its bound: in approximate mode the engine's own size once it reported one), what its engine
said of itself and of its load, and in precise mode the checks against the engine and the KV tiers
it reads. Reads the router's public parts only; the caller refreshed the load."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvgate.middleware.routing.router import Router


def replica_stats(router: Router) -> dict[str, Any]:
    precise = router.precise.stats() if router.precise is not None else {}
    out: dict[str, Any] = {}
    for r in router.replicas:
        out[r.name] = {
            "healthy": r.healthy,
            "in_flight": r.in_flight,
            "requests": r.requests,
            "pending_prefill_tokens": r.pending_prefill_tokens,
            "blocks": router.index.blocks(r.name),
            "capacity_blocks": router.index.capacity(r.name),
        }
        engine = router.book.describe(r.name)
        if engine is not None:
            out[r.name]["engine"] = engine
        if r.name in precise:
            out[r.name]["precise"] = precise[r.name]
        if (engine_load := router.engine_load.stats(r.name)) is not None:
            out[r.name]["engine_load"] = engine_load
        if router.precise is not None and (tiers := router.precise.tiers.readable(r.name)):
            # the KV tiers this replica's engine can load from (blocks each holds), and what a
            # loaded token costs in prefill tokens on this route (measured; 1 until then)
            out[r.name]["kv_tiers"] = {t: router.index.blocks(t) for t in sorted(tiers)}
            out[r.name]["load_cost"] = round(router.load_cost.value, 4)
    return out
