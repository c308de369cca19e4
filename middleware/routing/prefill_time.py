"""prefill_time: send a request where its first token is expected soonest, in seconds, from the
engines' own measured prefill rates and queues.

Per candidate replica r, with P = prompt_tokens, h(r) = tokens r need not recompute (its engine's
match plus what it can load from a KV tier, tiers.py), l(r) = the loaded part of them, λ = what a
loaded token costs in prefill tokens (load_cost.py), rate(r) = r's prefill tokens per second:

    queued(r) = max(pending(r), waiting(r))          prefill tokens ahead of this request on r
    ttft(r)   = (queued(r) + (P − h(r)) + λ · l(r)) / rate(r)

- pending(r): the uncached prompt tokens of requests this router (every process sharing its
  routing state) sent to r that have not produced their first token: exact, and current at
  every request.
- waiting(r): the engine's own count of waiting requests at its last report, in tokens (its
  measured mean prefill per request), aged by its measured rate since the report
  (engine_load.py). It covers work the router did not send (other proxies, direct clients) and
  is never added to pending, which the engine's count already includes.
- rate(r): measured from the engine's counters (engine_load.py); a replica not measured yet takes
  the mean of the measured candidates, and with none measured every candidate takes
  `cold_prefill_rate`, which then cancels out of the comparison.

The lowest ttft wins (ties: fewer requests in flight, then round robin). No charge for the
cache a choice duplicates: a conversation stays on the replica holding its history unless that
replica's queue exceeds another's by more than the history takes to recompute there.

Invariants (`choose`; tests/test_routing_prefill_time.py checks them on random states):
- never a replica with strictly more uncached tokens and strictly more queued work than another
  candidate that is at least as fast;
- with equal queued work and equal rates: a replica with the least prefill of its own (without
  KV tiers: one holding the longest prefix, as longest-match routing picks);
- with equal rates, a replica holding H more tokens than another (no tiers) is left for it only
  when its queued work exceeds the other's by at least H.
"""

from __future__ import annotations

from typing import Sequence

from kvgate.middleware.routing.base import ReplicaState, Rotation, RoutePlan
from kvgate.middleware.routing_config import PrefillTimeConfig

DEFAULT_COLD_PREFILL_RATE = 1000.0  # = PrefillTimeConfig's default (middleware/routing_config.py)


def queued_tokens(replica: ReplicaState) -> float:
    """Prefill tokens ahead of a new request on `replica`: the larger of the router's own pending
    count and the engine's reported waiting work (pure)."""
    return max(float(replica.pending_prefill_tokens), replica.engine_waiting_tokens)


def prefill_tokens(replica: ReplicaState, plan: RoutePlan) -> float:
    """This request's own prefill on `replica`, in prefill tokens: what neither its engine holds
    nor a tier it reads supplies, plus the loads at plan.load_cost each (pure)."""
    loaded = plan.loadable_tokens(replica.name)
    return max(0, plan.prompt_tokens - plan.matched_tokens(replica.name) - loaded) + plan.load_cost * loaded


def effective_rates(candidates: Sequence[ReplicaState], cold_rate: float = DEFAULT_COLD_PREFILL_RATE) -> list[float]:
    """Each candidate's prefill rate: its own measured one, else the mean of the measured
    candidates, else `cold_rate` (pure; every rate positive)."""
    measured = [r.prefill_rate for r in candidates if r.prefill_rate]
    fallback = sum(measured) / len(measured) if measured else cold_rate
    return [r.prefill_rate if r.prefill_rate else fallback for r in candidates]


def ttft_seconds(replica: ReplicaState, plan: RoutePlan, rate: float) -> float:
    """(queued + own prefill) / rate: the seconds until this request's first token on `replica`
    (pure)."""
    return (queued_tokens(replica) + prefill_tokens(replica, plan)) / rate


class PrefillTime:
    name = "prefill_time"
    reads_engine_load = True  # the proxy reads this route's engines' /metrics for it (Router.engine_report)

    def __init__(self, settings: PrefillTimeConfig | None = None, **knobs: float) -> None:
        """`settings`: routing.policy of the route; else built from `knobs` (cold_prefill_rate=...),
        validated as the config is."""
        self.settings = settings if settings is not None else PrefillTimeConfig(**knobs)
        self.cold_rate = self.settings.cold_prefill_rate
        self._ties = Rotation()

    def choose(self, candidates: Sequence[ReplicaState], plan: RoutePlan) -> ReplicaState:
        rotated = self._ties.rotated(candidates)
        rates = effective_rates(rotated, self.cold_rate)
        scored = [(ttft_seconds(r, plan, rate), r.in_flight, i) for i, (r, rate) in enumerate(zip(rotated, rates))]
        return rotated[min(scored)[2]]
