"""What `kvgate bench semantic` shows: progress lines on stderr, summary tables on stdout, the JSON file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def progress(message: str) -> None:
    """One progress line on stderr (stdout keeps the summary)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write `data` as indented JSON, creating parent directories."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def fmt(value: Any) -> str:
    """A table cell: '-' for None, 4 decimals for a float."""
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def print_pairs_summary(result: dict[str, Any]) -> None:
    """A short table: kvgate vs GPTCache at the threshold, then the sweep."""
    print(
        f"semantic cache on {result['pairs']} pairs ({result['duplicates']} duplicates), cosine threshold {result['threshold']}"
    )
    rows = [("kvgate", result)]
    if "skipped" not in result["with_verifier"]:
        rows.append(("+verifier", result["with_verifier"]))
    if "skipped" not in result["gptcache"]:
        rows.append(("gptcache", result["gptcache"]))
    print(f"{'cache':<10}{'precision':>10}{'recall':>9}{'hits':>7}{'correct':>9}{'p50 ms':>9}{'p99 ms':>9}")
    for name, r in rows:
        print(
            f"{name:<10}{fmt(r['precision']):>10}{fmt(r['recall']):>9}{r['hits']:>7}{r['correct_hits']:>9}"
            f"{fmt(r['lookup_p50_ms']):>9}{fmt(r['lookup_p99_ms']):>9}"
        )
    if "skipped" in result["gptcache"]:
        print(f"gptcache: skipped ({result['gptcache']['skipped']})")
    if "skipped" in result["with_verifier"]:
        print(f"+verifier: skipped ({result['with_verifier']['skipped']})")
    else:
        v = result["with_verifier"]
        print(
            f"+verifier: cosine >= {v['threshold']}, verifier >= {fmt(v['verifier_threshold'])}, top-{v['candidates']}; "
            "precision/recall over verifier thresholds at this cosine threshold (not tuned on these pairs):"
        )
        print(
            "  "
            + "  ".join(
                f"P>={r['precision_at_least']}: R={fmt(r.get('recall'))}" for r in v["curve_at_this_cosine_threshold"]
            )
        )
    print("sweep (kvgate):  threshold  precision  recall  hits")
    for s in result["sweep"]:
        print(f"{'':16}{s['threshold']:>9.2f}{fmt(s['precision']):>11}{fmt(s['recall']):>8}{s['hits']:>6}")


def print_proxy_summary(result: dict[str, Any]) -> None:
    """A short table of the proxy latencies."""
    print(
        f"proxy latency with {result['scope_entries']} entries in the scope ({result['index_kind']} index, "
        f"{result.get('filler', 'random')} filler), threshold {result['threshold']}"
    )
    print(f"{'request':<22}{'count':>12}{'p50 ms':>9}{'p99 ms':>9}")
    lines = [
        ("miss (seed)", f"{result['seed_misses']}/{result['seeded']}", result["miss_p50_ms"], result["miss_p99_ms"]),
        (
            "exact hit",
            f"{result['exact_hits']}/{result['exact_requests']}",
            result["exact_hit_p50_ms"],
            result["exact_hit_p99_ms"],
        ),
        (
            "semantic hit",
            f"{result['semantic_hits']}/{result['semantic_requests']}",
            result["semantic_hit_p50_ms"],
            result["semantic_hit_p99_ms"],
        ),
        (
            "semantic miss",
            f"{result['semantic_requests'] - result['semantic_hits']}",
            result.get("semantic_miss_p50_ms"),
            result.get("semantic_miss_p99_ms"),
        ),
        ("backend direct", str(result["queries"]), result["backend_direct_p50_ms"], result["backend_direct_p99_ms"]),
    ]
    for name, count, p50, p99 in lines:
        print(f"{name:<22}{count:>12}{fmt(p50):>9}{fmt(p99):>9}")
    if result.get("seed_semantic_hits"):
        print(
            f"seed questions answered from the filler by a semantic hit (then stored with no-cache): "
            f"{result['seed_semantic_hits']}/{result['seeded']}"
        )
    print(f"semantic hits returning the right answer: {result['semantic_hits_correct']}/{result['semantic_hits']}")
    for kind, t in result.get("semantic_by_kind", {}).items():
        print(f"  {kind:<12} {t['hits']:>5}/{t['requests']:<5} hit, {t['correct']} right")
