"""Markdown tables of routing-arena results (the JSON `kvgate bench routing --json` writes), so
the figures in the docs come from the JSON and nowhere else: `kvgate bench routing --table
FILE...` prints them, `markdown(result)` returns one scenario's.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Sequence

Z_975 = statistics.NormalDist().inv_cdf(0.975)  # two-sided 95%
ANCHOR_NAMES = {"sglang": "sglang-router", "vllm_router": "vllm-router"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def goal(result: dict[str, Any]) -> tuple[bool, list[str]]:
    """The arena's goal for kvgate cache_aware against each anchor present (pure): hit rate >= the
    anchor's, TTFT p99 <= the anchor's, 0 errors. Returns (all met, one line per anchor)."""
    ca = result["policies"].get("cache_aware", {})
    if "hit_rate" not in ca:
        return False, ["cache_aware was not run"]
    lines, met = [], ca["errors"] == 0
    for name, label in ANCHOR_NAMES.items():
        an = result["policies"].get(name, {})
        if "hit_rate" not in an:
            continue
        hit_ok, p99_ok = ca["hit_rate"] >= an["hit_rate"], ca["ttft_p99_s"] <= an["ttft_p99_s"]
        met = met and hit_ok and p99_ok
        lines.append(
            f"vs {label}: hit {ca['hit_rate'] - an['hit_rate']:+.3f} ({'met' if hit_ok else 'NOT met'}), "
            f"p99 ×{ca['ttft_p99_s'] / an['ttft_p99_s']:.2f} ({'met' if p99_ok else 'NOT met'})"
        )
    if ca["errors"]:
        lines.append(f"cache_aware errors: {ca['errors']} (NOT met)")
    return met, lines


def markdown(result: dict[str, Any]) -> str:
    """One scenario: a heading, how it was run, the table, the ceilings and the goal check."""
    tuned = result.get("tune_slice")
    chosen = (result.get("tuning") or {}).get("chosen", {})
    head = [
        f"#### {result['scenario']}",
        "",
        f"{result['requests']} requests (slice {result['report_slice']} reported"
        + (f"; thresholds tuned on slice {tuned}" if tuned else "; no tuning")
        + f"), {result['replicas']} replicas × "
        f"{result['capacity_tokens']:,} tokens, sim model {result['sim_model']}"
        + (f" (step budget {result['step_tokens']} tokens)" if result.get("step_tokens") else "")
        + f", prefill {result['prefill_tps']:,.0f} tok/s, speed ×{result['speed']:g}, capacity hint "
        f"{result.get('capacity_hint', 'exact')}.",
        "",
        "| router | hit rate | TTFT p50 | TTFT p99 | TTFT mean | engine TTFT p50 / p99 | imbalance | errors "
        "| queued: router est. / replica | load generator lag p99 / max |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = []
    for name, s in result["policies"].items():
        if "hit_rate" not in s:
            rows.append(f"| {name} | skipped: {s.get('skipped', '?')} | | | | | | | | |")
            continue
        label = ANCHOR_NAMES.get(name, f"kvgate {name}")
        if name in chosen:
            label += " (" + ", ".join(f"{k}={v}" for k, v in chosen[name].items()) + ")"
        q = s.get("queued_check", {})
        queued = (
            f"{q['router_estimate_mean']:,.0f} / {q['replica_queued_mean']:,.0f}"
            if "router_estimate_mean" in q
            else (f"– / {q['replica_queued_mean']:,.0f}" if q else "")
        )
        bold = "**" if name == "cache_aware" else ""
        engine = f"{_ms(s['engine_ttft_p50_s'])} / {_ms(s['engine_ttft_p99_s'])}" if "engine_ttft_p50_s" in s else ""
        lag = f"{_ms(s['client_lag_p99_s'])} / {_ms(s['client_lag_max_s'])}" if "client_lag_p99_s" in s else "–"
        rows.append(
            f"| {bold}{label}{bold} | {s['hit_rate']:.3f} | {_ms(s['ttft_p50_s'])} | {_ms(s['ttft_p99_s'])} | "
            f"{_ms(s['ttft_mean_s'])} | {engine} | {s['imbalance']:.2f} | {s['errors']} | {queued} | {lag} |"
        )
    met, lines = goal(result)
    tail = [
        "",
        f"Ceilings on this slice: one unlimited LRU {result['ceiling_infinite']:.3f}, one LRU of the total capacity "
        f"{result['ceiling_lru']:.3f}.",
        "",
        f"Goal {'met' if met else 'NOT met'}: " + "; ".join(lines) + ".",
        "",
    ]
    return "\n".join(head + rows + tail)


def summary(results: Sequence[dict[str, Any]]) -> str:
    """One row per scenario: cache_aware against the anchors (hit rate, TTFT p99, errors), each
    router's share of the TTFT (client mean − engine mean: means add, percentiles do not), and
    whether the goal is met."""
    rows = [
        "| scenario | hit: kvgate / sglang / vllm | TTFT p99: kvgate / sglang / vllm | kvgate errors "
        "| router's share of TTFT, mean (client − engine): kvgate / sglang / vllm | goal |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        p = r["policies"]
        ca, sg, vl = (p.get(k, {}) for k in ("cache_aware", "sglang", "vllm_router"))
        hit = " / ".join(f"{x['hit_rate']:.3f}" if "hit_rate" in x else "–" for x in (ca, sg, vl))
        p99 = " / ".join(_ms(x["ttft_p99_s"]) if "hit_rate" in x else "–" for x in (ca, sg, vl))
        share = " / ".join(
            _ms(x["ttft_mean_s"] - x["engine_ttft_mean_s"]) if "engine_ttft_mean_s" in x else "–" for x in (ca, sg, vl)
        )
        met, _ = goal(r)
        rows.append(
            f"| {r['scenario']} | {hit} | {p99} | {ca.get('errors', '–')} | {share} | {'met' if met else 'NOT met'} |"
        )
    return "\n".join(rows) + "\n"


def _setting(result: dict[str, Any]) -> tuple[str, str, float]:
    """What makes two runs the same scenario: the trace file's name, the sim model, the speed."""
    return Path(result["trace"]).name, result["sim_model"], float(result["speed"])


def _both_ran(result: dict[str, Any], anchor: str) -> bool:
    return all("hit_rate" in result["policies"].get(name, {}) for name in ("cache_aware", anchor))


def _margins(runs: Sequence[dict[str, Any]], anchor: str) -> list[float]:
    """cache_aware's hit rate minus `anchor`'s, for the runs where both ran."""
    return [
        r["policies"]["cache_aware"]["hit_rate"] - r["policies"][anchor]["hit_rate"]
        for r in runs
        if _both_ran(r, anchor)
    ]


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its 95% normal interval, mean ± 1.96·sd/√n (pure; sd with
    n − 1; for one value the interval is that value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = Z_975 * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def pooled(results: Sequence[dict[str, Any]]) -> str:
    """Several runs of the same scenarios, pooled: per scenario (`_setting`, first-seen order) the
    runs, how many met the goal, cache_aware's hit-rate margin over each anchor (mean and the
    smallest) and its largest TTFT p99 as a multiple of sglang-router's; then every run together,
    with the 95% interval of the mean margin. A margin at the LRU ceiling moves from run to run by
    a request or two, so one run's sign says little; the mean over runs says more."""
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(_setting(r), []).append(r)
    rows = [
        "| scenario | runs | goal met | hit margin vs sglang: mean (min) | vs vllm: mean (min) | TTFT p99 / sglang's: max |",
        "|---|---|---|---|---|---|",
    ]

    def row(label: str, runs: Sequence[dict[str, Any]], interval: bool = False) -> str:
        cells = []
        for anchor in ("sglang", "vllm_router"):
            margins = _margins(runs, anchor)
            if not margins:
                cells.append("–")
                continue
            mean, low, high = mean_interval(margins)
            cells.append(
                f"{mean:+.4f} ({min(margins):+.4f})" + (f", 95% CI {low:+.4f} to {high:+.4f}" if interval else "")
            )
        ratios = [
            r["policies"]["cache_aware"]["ttft_p99_s"] / r["policies"]["sglang"]["ttft_p99_s"]
            for r in runs
            if _both_ran(r, "sglang")
        ]
        met = sum(goal(r)[0] for r in runs)
        return (
            f"| {label} | {len(runs)} | {met} | {cells[0]} | {cells[1]} | "
            + (f"×{max(ratios):.2f}" if ratios else "–")
            + " |"
        )

    rows += [row(runs[0]["scenario"], runs) for runs in groups.values()]
    if len(groups) > 1:
        rows.append(row("**all runs**", results, interval=True))
    return "\n".join(rows) + "\n"


def load_result(path: Path, command: str = "kvgate bench routing --table") -> dict[str, Any]:
    """One `kvgate bench routing --json` result; anything else stops with a message naming the file."""
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{command}: cannot read {path}: {exc}") from None
    keys = ("scenario", "trace", "sim_model", "speed", "report_slice", "policies")
    missing = [k for k in keys if not isinstance(result, dict) or k not in result]
    if missing:
        raise SystemExit(f"{command}: {path} is not a `kvgate bench routing --json` result (no {', '.join(missing)})")
    return result


def print_tables(results: Sequence[dict[str, Any] | Path]) -> None:
    """Each result's table; with several, the summary first, and when a scenario was run more
    than once, the pooled table before that."""
    loaded = [item if isinstance(item, dict) else load_result(Path(item)) for item in results]
    if len({_setting(r) for r in loaded}) < len(loaded):
        print(pooled(loaded))
    if len(loaded) > 1:
        print(summary(loaded))
    for result in loaded:
        print(markdown(result))
