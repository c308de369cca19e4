"""Load or recompute: the scheduler loads a stored prefix only where reading it is estimated
faster than prefilling it, on this engine, from this engine's own measurements.

Load time of k chunks = k x (per-chunk cost + stored bytes per chunk / tier bandwidth); the time
it saves = the chunks' tokens / this engine's prefill rate. Both estimates are exponentially
weighted averages of what the engine measured (bytes, chunks and seconds of its loads; tokens
and seconds of its prefill-heavy steps), starting from cold-start defaults that favour loading
(a fresh engine loads, measures, and corrects). A measurement's weight is max(ALPHA, 1/n) for the
n-th measurement of that estimate: the first replaces the cold default outright and the first few
are averaged evenly, so one wrong default costs one decision, not ten. The pure functions decide;
`Estimates` keeps the averages.
"""

from __future__ import annotations

from dataclasses import dataclass

ALPHA = 0.2  # weight of the newest measurement: about the last ten loads or steps count


@dataclass(frozen=True)
class Costs:
    load_bytes_per_s: float  # stored bytes per second, tier read to engine blocks
    per_chunk_s: float  # fixed cost of one chunk (a lookup, a file, a round trip)
    prefill_tokens_per_s: float


COLD = Costs(load_bytes_per_s=2e9, per_chunk_s=2e-4, prefill_tokens_per_s=8e3)


def load_seconds(stored_bytes: float, chunks: int, costs: Costs) -> float:
    """Estimated seconds to load `chunks` chunks of `stored_bytes` in all.

    Invariant: >= 0, and non-decreasing in stored_bytes and in chunks."""
    return max(0, chunks) * costs.per_chunk_s + max(0.0, stored_bytes) / costs.load_bytes_per_s


def prefill_seconds(tokens: int, costs: Costs) -> float:
    """Estimated seconds this engine takes to prefill `tokens` tokens. Invariant: >= 0, linear."""
    return max(0, tokens) / costs.prefill_tokens_per_s


def chunks_worth_loading(n_chunks: int, chunk_tokens: int, chunk_bytes: float, costs: Costs) -> int:
    """How many of the `n_chunks` leading stored chunks to load (the rest is prefilled).

    Invariants: the answer k is in [0, n_chunks]; loading k chunks is never estimated slower than
    prefilling their tokens; more bandwidth, a smaller per-chunk cost, fewer bytes per chunk or a
    slower prefill never load fewer chunks. Both costs grow linearly with k, so the answer is all
    or nothing."""
    if n_chunks <= 0:
        return 0
    per_chunk_load = load_seconds(chunk_bytes, 1, costs)
    return n_chunks if per_chunk_load <= prefill_seconds(chunk_tokens, costs) else 0


def in_background(load_s: float, threshold_s: float) -> bool:
    """Whether a load estimated at `load_s` runs beside the engine's steps rather than before
    the next forward. Invariant: monotone in load_s; a threshold <= 0 sends every load there."""
    return load_s > threshold_s


def ewma(old: float, new: float, alpha: float = ALPHA) -> float:
    """Invariant: the result lies between old and new (inclusive)."""
    return old + alpha * (new - old)


def weight(seen: int, alpha: float = ALPHA) -> float:
    """The weight of the next measurement after `seen` earlier ones: 1 for the first (the cold
    default is not a measurement), then 1/n until that falls under `alpha`. Invariant: in
    [alpha, 1], non-increasing in `seen`."""
    return max(alpha, 1.0 / (max(0, seen) + 1))


def slowest(tiers: list[str], order: list[str]) -> str:
    """The tier of `tiers` latest in lookup `order` (the one a load waits for); "" when none.
    Invariant: the answer is one of `tiers`, or "" exactly when `tiers` is empty."""
    known = [t for t in tiers if t in order]
    if known:
        return max(known, key=order.index)
    return tiers[-1] if tiers else ""


class Estimates:
    """This engine's measured costs: load bandwidth per tier, one prefill rate; from `cold`."""

    def __init__(self, cold: Costs = COLD) -> None:
        self.cold = cold
        self._tiers: dict[str, Costs] = {}
        self._seen: dict[str, int] = {}  # measured loads per tier
        self.prefill_tokens_per_s = cold.prefill_tokens_per_s
        self.measured_loads = 0
        self.measured_prefills = 0

    def costs(self, tier: str = "") -> Costs:
        """What a load from `tier` is estimated to cost (the cold defaults until it was measured)."""
        t = self._tiers.get(tier, self.cold)
        return Costs(t.load_bytes_per_s, t.per_chunk_s, self.prefill_tokens_per_s)

    def observe_load(self, stored_bytes: float, chunks: int, seconds: float, tier: str = "") -> None:
        """One measured load from `tier`. The per-chunk cost keeps its estimate; bandwidth absorbs the rest."""
        if chunks <= 0 or seconds <= 0 or stored_bytes <= 0:
            return
        c = self._tiers.get(tier, self.cold)
        moving = max(seconds - chunks * c.per_chunk_s, seconds * 0.1)
        seen = self._seen.get(tier, 0)
        self._tiers[tier] = Costs(
            ewma(c.load_bytes_per_s, stored_bytes / moving, weight(seen)), c.per_chunk_s, c.prefill_tokens_per_s
        )
        self._seen[tier] = seen + 1
        self.measured_loads += 1

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        self.prefill_tokens_per_s = ewma(self.prefill_tokens_per_s, tokens / seconds, weight(self.measured_prefills))
        self.measured_prefills += 1

    def gauges(self, tiers: list[str]) -> dict[str, float]:
        """What the engine's /metrics shows of the estimates, for `tiers`."""
        out = {f"gate_load_gbps_{t}": self.costs(t).load_bytes_per_s / 1e9 for t in tiers}
        out["gate_prefill_tokens_per_s"] = self.prefill_tokens_per_s
        return out
