"""The figures of `kvgate bench vllm` (tools/bench/vllm_arena.py), pure: vLLM's /metrics read,
the oracle cached fraction, one run's summary and one router's over its runs.

Oracle (`oracle_cached`): every request on the replica that already computed its prefix, with an
unbounded cache, counted as vLLM counts a hit: whole blocks of the engine's block_size, and never
the prompt's last token (vLLM always computes it, so a prompt of exactly k blocks hits at most
k-1). What a request can hit is the longest whole-block prefix it shares with any sequence computed
before it was sent: the prompt and the generated tokens but the last (whose KV is never computed)
of every request that had finished by then.
"""

from __future__ import annotations

import hashlib
import math
import re
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from kvgate.tools.bench.arena_table import mean_interval
from kvgate.tools.bench.stats import pct
from kvgate.tools.bench.wire_hops import pooled as wire_pooled

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)\s*$", re.M)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
CACHED, PROMPT = "vllm:prompt_tokens_cached_total", "vllm:prompt_tokens_total"
EXTERNAL = "vllm:external_prefix_cache_hits_total"  # tokens a KV connector loaded


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample of `name` in a Prometheus text page (over its label sets)."""
    return sum(float(v) for n, _, v in _SAMPLE.findall(text) if n == name)


def computed_per_server(before: Sequence[str], after: Sequence[str]) -> list[int]:
    """Prompt tokens each server prefilled between two reads of its /metrics: its prompt tokens
    less those its prefix cache held (vLLM counts both; with no KV connector the rest is what it
    computed). Where a router put the prefill work, for anchors and kvgate alike."""
    return [
        int(
            metric_sum(a, "vllm:prompt_tokens_total")
            - metric_sum(b, "vllm:prompt_tokens_total")
            - (metric_sum(a, "vllm:prefix_cache_hits_total") - metric_sum(b, "vllm:prefix_cache_hits_total"))
        )
        for b, a in zip(before, after)
    ]


# vLLM's own request-latency histograms: from the request's arrival in its engine (after its API
# server rendered and tokenized the prompt) to the first token / to the end / waiting for a slot
ENGINE_LATENCY = {
    "engine_ttft_mean_s": "vllm:time_to_first_token_seconds",
    "engine_e2e_mean_s": "vllm:e2e_request_latency_seconds",
    "engine_queue_mean_s": "vllm:request_queue_time_seconds",
}


def engine_latency(before: Sequence[str], after: Sequence[str]) -> dict[str, float | None]:
    """Each ENGINE_LATENCY histogram's mean over the requests between two reads of every server's
    page (None when no request was counted), summed over the servers. With a client's own TTFT of
    the same requests, the difference is what lies between the client and the engine: the router,
    and vLLM's API server (the same for every arm)."""
    out: dict[str, float | None] = {}
    for key, name in ENGINE_LATENCY.items():
        total = sum(metric_sum(a, f"{name}_sum") - metric_sum(b, f"{name}_sum") for a, b in zip(after, before))
        count = sum(metric_sum(a, f"{name}_count") - metric_sum(b, f"{name}_count") for a, b in zip(after, before))
        out[key] = round(total / count, 4) if count > 0 else None
    return out


LOOP_LAG = "kvgate_event_loop_lag_seconds"  # kvgate's own loop-lag sampler (telemetry/loop_lag.py)
LAG_OVER_MS = (10, 50, 100)


def loop_lag(before: str, after: str) -> dict[str, Any] | None:
    """A kvgate router's event-loop lag between two reads of its /metrics: the samples taken, their
    mean (ms) and the share later than each of LAG_OVER_MS (from the histogram's buckets; a bound
    that is not a bucket edge is left out). None when the page has no samples of it."""

    def buckets(text: str) -> dict[float, float]:
        out: dict[float, float] = {}
        for n, labels, v in _SAMPLE.findall(text):
            if n == f"{LOOP_LAG}_bucket":
                le = dict(_LABEL.findall(labels or "")).get("le", "")
                edge = math.inf if le == "+Inf" else float(le)
                out[edge] = out.get(edge, 0.0) + float(v)
        return out

    samples = metric_sum(after, f"{LOOP_LAG}_count") - metric_sum(before, f"{LOOP_LAG}_count")
    if samples <= 0:
        return None
    total = metric_sum(after, f"{LOOP_LAG}_sum") - metric_sum(before, f"{LOOP_LAG}_sum")
    b, a = buckets(before), buckets(after)
    out: dict[str, Any] = {"samples": int(samples), "mean_ms": round(total * 1000 / samples, 3)}
    for ms in LAG_OVER_MS:
        edge = ms / 1000
        if edge in a:
            out[f"over_{ms}ms"] = round(1 - (a[edge] - b.get(edge, 0.0)) / samples, 4)
    return out


def render_requests(pages: Iterable[str]) -> float | None:
    """Requests vLLM's API server answered on a `.../render` path (vllm-router asks for the token
    ids of a prompt there), summed over the pages; None when no page counts requests per handler."""
    total, found = 0.0, False
    for page in pages:
        for n, labels, v in _SAMPLE.findall(page):
            if n == "http_requests_total":
                found = True
                total += float(v) if dict(_LABEL.findall(labels or "")).get("handler", "").endswith("/render") else 0.0
    return total if found else None


def metric_labels(text: str, name: str) -> dict[str, str]:
    """The labels of the first sample of `name` (an *_info gauge), {} when absent."""
    for n, labels, _ in _SAMPLE.findall(text):
        if n == name:
            return dict(_LABEL.findall(labels or ""))
    return {}


def counters(pages: Iterable[str]) -> dict[str, float]:
    """Cached and total prompt tokens summed over the servers' /metrics pages."""
    pages = list(pages)
    return {
        "cached": sum(metric_sum(p, CACHED) for p in pages),
        "prompt": sum(metric_sum(p, PROMPT) for p in pages),
        "external": sum(metric_sum(p, EXTERNAL) for p in pages),
    }


@dataclass
class Computed:
    """One request as the oracle sees it: when it was sent and finished (any one clock), its
    prompt's token ids and the generated ids whose KV the engine computed (all but the last)."""

    sent: float
    done: float
    prompt: Sequence[int]
    output: Sequence[int] = ()


def _chain(ids: Sequence[int], block: int, upto: int) -> list[bytes]:
    """Chained digests of the first `upto` whole blocks of `ids`."""
    out, prev = [], b""
    for b in range(upto):
        prev = hashlib.blake2b(
            prev + b"".join(t.to_bytes(4, "little") for t in ids[b * block : (b + 1) * block]), digest_size=16
        ).digest()
        out.append(prev)
    return out


def oracle_cached(requests: Sequence[Computed], block_size: int) -> list[int]:
    """Cached prompt tokens of each request under the oracle (see the module docstring)."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    seen: set[bytes] = set()
    pending = sorted(range(len(requests)), key=lambda i: requests[i].done)
    out = [0] * len(requests)
    k = 0
    for i in sorted(range(len(requests)), key=lambda i: requests[i].sent):
        r = requests[i]
        while k < len(pending) and requests[pending[k]].done <= r.sent:
            d = requests[pending[k]]
            seq = [*d.prompt, *d.output]
            seen.update(_chain(seq, block_size, len(seq) // block_size))
            k += 1
        hits = 0
        for digest in _chain(r.prompt, block_size, max(0, len(r.prompt) - 1) // block_size):
            if digest not in seen:
                break
            hits += 1
        out[i] = hits * block_size
    return out


def run_summary(
    ttfts: Sequence[float],
    errors: Sequence[str],
    requests: int,
    before: dict[str, float],
    after: dict[str, float],
    **extra: Any,
) -> dict[str, Any]:
    """One run of one router: TTFTs of the answered requests, the engines' counter deltas."""
    prompt, cached = after["prompt"] - before["prompt"], after["cached"] - before["cached"]
    external = after.get("external", 0.0) - before.get("external", 0.0)
    return {
        "requests": requests,
        "errors": len(errors),
        "error_samples": list(errors[:3]),
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else None,
        "ttft_p50_s": pct(ttfts, 0.5) if ttfts else None,
        "ttft_p90_s": pct(ttfts, 0.9) if ttfts else None,
        "prompt_tokens": int(prompt),
        "cached_tokens": int(cached),
        "cached_fraction": cached / prompt if prompt else None,
        "external_tokens": int(external),
        "external_fraction": external / prompt if prompt else None,
        "ttfts_s": [round(t, 4) for t in ttfts],
        **extra,
    }


def router_summary(runs: Sequence[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """One router over its runs: mean of the runs' mean TTFTs with its 95% half-width,
    percentiles of every TTFT pooled, cached fraction of every run's tokens together."""
    means = [r["ttft_mean_s"] for r in runs if r.get("ttft_mean_s") is not None]
    mean, _, high = mean_interval(means) if means else (None, None, None)
    pooled = [t for r in runs for t in r.get("ttfts_s", [])]
    prompt, cached = sum(r["prompt_tokens"] for r in runs), sum(r["cached_tokens"] for r in runs)
    external = sum(r.get("external_tokens", 0) for r in runs)
    return {
        "ttft_mean_s": mean,
        "ttft_mean_ci_s": (high - mean) if len(means) > 1 else None,  # no interval from one run
        "ttft_p50_s": pct(pooled, 0.5) if pooled else None,
        "ttft_p90_s": pct(pooled, 0.9) if pooled else None,
        "cached_fraction": cached / prompt if prompt else None,
        "external_fraction": external / prompt if prompt else None,
        "errors": sum(r["errors"] for r in runs),
        "requests": sum(r["requests"] for r in runs),
        **{key: _mean_of(runs, key) for key in ("engine_ttft_mean_s", "total_mean_s", "inter_token_mean_s", "wall_s")},
        "added_ttft_ms": added_ttft_ms(runs),
        **wire_pooled(runs),
        **extra,
        "runs": list(runs),
    }


def added_ttft_ms(runs: Sequence[dict[str, Any]]) -> float | None:
    """The client's mean TTFT less vLLM's own (`engine_ttft_mean_s`), run by run, averaged, in ms
    (None where no run has both): what the router's path adds both ways, plus what every arm
    shares (vLLM's HTTP front end rendering and tokenizing the prompt, the client's own reading).
    With the same engines and prompts in every arm, the arms' difference is their routers'."""
    gaps = [
        (r["ttft_mean_s"] - r["engine_ttft_mean_s"]) * 1000
        for r in runs
        if r.get("ttft_mean_s") is not None and r.get("engine_ttft_mean_s") is not None
    ]
    return round(statistics.fmean(gaps), 2) if gaps else None


def _mean_of(runs: Sequence[dict[str, Any]], key: str) -> float | None:
    """The mean of a per-run figure over the runs that have it (None if none has)."""
    values = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.fmean(values), 4) if values else None


# two-sided 95% quantiles of Student's t by degrees of freedom (the paired ratio's interval)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
T_975_LARGE = 2.0  # beyond the table (df > 10): within 0.09 of the exact quantile
# a difference worth telling apart, and the normal quantiles for a two-sided 95% test at 80% power
RESOLVE_DIFFERENCE = 0.05
Z_975, Z_80 = 1.960, 0.842


def paired_ratio(arm: Sequence[float], anchor: Sequence[float]) -> dict[str, Any] | None:
    """An arm's mean TTFT against an anchor's, run by run: every run sends both the same turns
    back to back, so a run's ratio cancels what the machine did during that run. The geometric
    mean of the per-run ratios and its 95% interval (Student's t on the log ratios); None
    without a run both have."""
    logs = [math.log(a / b) for a, b in zip(arm, anchor) if a and b and a > 0 and b > 0]
    if not logs:
        return None
    mean = statistics.fmean(logs)
    out: dict[str, Any] = {"ratio": round(math.exp(mean), 4), "runs": len(logs)}
    if len(logs) > 1:
        spread = statistics.stdev(logs)
        half = T_975.get(len(logs) - 1, T_975_LARGE) * spread / math.sqrt(len(logs))
        out["ci95"] = [round(math.exp(mean - half), 4), round(math.exp(mean + half), 4)]
        out["sd_log"] = round(spread, 4)
        out["runs_to_resolve"] = runs_to_resolve(spread)
    return out


def runs_to_resolve(sd_log: float, difference: float = RESOLVE_DIFFERENCE) -> int:
    """Paired runs for a two-sided 95% interval to exclude 1 with 80% power when the true ratio
    is 1 - `difference` and the per-run log ratios spread by `sd_log` (normal approximation);
    at least 2. Invariant: grows with the square of `sd_log`."""
    effect = -math.log(1 - difference)
    return max(2, math.ceil(((Z_975 + Z_80) * sd_log / effect) ** 2))


def paired_ratios(
    runs: dict[str, Sequence[dict[str, Any]]], arms: Sequence[str], anchors: Sequence[str], key: str = "ttft_mean_s"
) -> dict:
    """`{"<arm>/<anchor>": paired_ratio}` of each run's `key` for every arm and anchor that both
    ran, matched by run number (`engine_ttft_mean_s`: vLLM's own TTFT, the placement's part of
    the client's)."""
    out = {}
    for arm in arms:
        for anchor in anchors:
            if arm not in runs or anchor not in runs:
                continue
            mine = {r["run"]: r.get(key) for r in runs[arm]}
            theirs = {r["run"]: r.get(key) for r in runs[anchor]}
            common = sorted(set(mine) & set(theirs))
            ratio = paired_ratio([mine[n] for n in common], [theirs[n] for n in common])
            if ratio is not None:
                out[f"{arm}/{anchor}"] = ratio
    return out


def print_table(result: dict[str, Any]) -> None:
    def ms(x: float | None) -> str:
        return "–" if x is None else f"{x * 1000:.0f}"

    print(
        f"{'router':20s} {'ttft mean ms':>14s} {'p50':>6s} {'p90':>6s} {'cached':>7s} {'errors':>6s} {'requests':>8s} "
        f"{'router cpu ms/req':>17s} {'engines cpu s':>13s} {'engine ttft ms':>14s} {'wall s':>6s}"
    )
    for name, s in result["routers"].items():
        cached = "–" if s["cached_fraction"] is None else f"{s['cached_fraction']:.3f}"
        per_req, engines, wall = s.get("router_cpu_ms_per_request"), s.get("engines_cpu_s"), s.get("wall_s")
        print(
            f"{name:20s} {ms(s['ttft_mean_s']):>7s} ±{ms(s['ttft_mean_ci_s']):>5s} {ms(s['ttft_p50_s']):>6s} "
            f"{ms(s['ttft_p90_s']):>6s} {cached:>7s} {s['errors']:>6d} {s['requests']:>8d} "
            f"{'–' if per_req is None else f'{per_req:.2f}':>17s} {'–' if engines is None else f'{engines:.1f}':>13s} "
            f"{ms(s.get('engine_ttft_mean_s')):>14s} {'–' if wall is None else f'{wall:.1f}':>6s}"
        )
    for what, key in (("mean TTFT", "paired"), ("vLLM's own mean TTFT", "paired_engine_ttft")):
        for pair, ratio in result.get(key, {}).items():
            ci = ratio.get("ci95")
            interval = f" (95% interval {ci[0]:.3f}–{ci[1]:.3f})" if ci else ""
            need = ratio.get("runs_to_resolve")
            spread = (
                f"; at this run-to-run spread about {need} runs would tell a {RESOLVE_DIFFERENCE:.0%} difference"
                if need
                else ""
            )
            print(f"{what} {pair}, run by run: {ratio['ratio']:.3f}x over {ratio['runs']} runs{interval}{spread}")
    added = {name: s["added_ttft_ms"] for name, s in result["routers"].items() if s.get("added_ttft_ms") is not None}
    if added:
        print("client TTFT beyond vLLM's own, ms: " + ", ".join(f"{name} {ms:.1f}" for name, ms in added.items()))
    wire = {name: s for name, s in result["routers"].items() if s.get("wire_requests")}
    if wire:
        print(
            "on the wire, mean ms from the request reaching the router to its request to the engine / from the "
            "engine's first token to the router's: "
            + ", ".join(
                f"{name} {s['wire_pre_mean_ms']:.2f} / {s['wire_post_mean_ms']:.2f}" for name, s in wire.items()
            )
        )
    gaps = {name: s["inter_token_mean_s"] for name, s in result["routers"].items() if s.get("inter_token_mean_s")}
    if gaps:
        print("mean gap between tokens, ms: " + ", ".join(f"{name} {gap * 1000:.1f}" for name, gap in gaps.items()))
    if result["oracle_cached_fraction"] is not None:
        print(
            f"oracle cached fraction {result['oracle_cached_fraction']:.3f}; kv cache {result['kv_cache_tokens']} tokens "
            f"per server, block {result.get('block_size')}"
        )
