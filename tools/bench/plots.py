"""Figures of benchmark results (matplotlib, Agg: no display needed), drawn from the result JSON
each benchmark writes, so a plot can be made again from a saved run without re-running it.

  semantic  precision and recall vs the cosine threshold (the sweep), GPTCache's point marked
  routing   TTFT CDF per router (needs the per-request `ttfts_s` the arena writes)
  kv        TTFT per stored state (cold / warm RAM / warm disk), load and prefill stacked
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

SIZE = (6.4, 3.6)
DPI = 100  # ~640x360 px: a few tens of KB as PNG


class PlotInputError(ValueError):
    """The JSON is not a result of that benchmark (or lacks what the plot needs)."""


def semantic_figure(result: dict[str, Any]) -> Figure:
    """Precision and recall of the top-1 answer at each threshold of the sweep."""
    sweep = [s for s in _need(result, "sweep", "semantic") if s.get("precision") is not None]
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    thresholds = [s["threshold"] for s in sweep]
    ax.plot(thresholds, [s["precision"] for s in sweep], marker="o", label="kvgate precision")
    ax.plot(thresholds, [s["recall"] for s in sweep], marker="s", label="kvgate recall")
    anchor = result.get("gptcache") or {}
    if anchor.get("precision") is not None:
        ax.plot(
            [anchor["threshold"]] * 2,
            [anchor["precision"], anchor["recall"]],
            "kx",
            markersize=9,
            label="GPTCache (same run)",
        )
    ax.set(
        xlabel="cosine threshold",
        ylabel="fraction",
        ylim=(0, 1),
        title=f"Semantic cache on {result.get('pairs', '?')} Quora pairs: precision / recall",
    )
    return _finish(fig, ax)


def routing_figure(result: dict[str, Any]) -> Figure:
    """Empirical CDF of the client-side TTFT, one line per router."""
    policies = _need(result, "policies", "routing")
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    drawn = 0
    for name, summary in policies.items():
        ttfts = summary.get("ttfts_s")
        if not ttfts:
            continue
        router = str(summary.get("router", name))
        label = f"{router if router.startswith('kvgate') else name} (p99 {summary['ttft_p99_s']:.2f} s)"  # short: no options
        ax.step(sorted(ttfts), [(i + 1) / len(ttfts) for i in range(len(ttfts))], where="post", label=label)
        drawn += 1
    if not drawn:
        raise PlotInputError("routing: no policy has per-request TTFTs (`ttfts_s`); re-run `kvgate bench routing`")
    ax.set_xscale("log")
    ax.set(
        xlabel="TTFT at the client (s, log scale)",
        ylabel="fraction of requests",
        ylim=(0, 1.01),
        title=f"Routing arena: {result.get('scenario', '')}, {result.get('requests', '?')} requests",
    )
    return _finish(fig, ax, legend="upper left")


def kv_figure(result: dict[str, Any]) -> Figure:
    """Median TTFT per stored state, with its KV-load and prefill parts as bars beside it (side by
    side, not stacked: the axis is logarithmic)."""
    modes = _need(result, "modes", "kv")
    labels = {
        "cold": "cold",
        "warm_ram": "warm RAM",
        "warm_disk": "warm disk\n(page cache dropped)",
        "warm_disk_pagecache": "warm disk\n(page cache)",
    }
    names = [m for m in labels if m in modes]
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    width = 0.27
    for offset, (field, label) in zip(
        (-width, 0.0, width), (("ttft_s", "TTFT"), ("load_s", "KV load"), ("prefill_s", "prefill"))
    ):
        ax.bar([i + offset for i in range(len(names))], [max(modes[m][field], 1e-4) for m in names], width, label=label)
    for i, m in enumerate(names):
        ax.annotate(
            f"{modes[m]['ttft_s']:.2f} s", (i - width, modes[m]["ttft_s"]), ha="center", va="bottom", fontsize=8
        )
    ax.set_xticks(range(len(names)), [labels[m] for m in names])
    ax.set_yscale("log")
    ax.set(
        ylabel="seconds (log scale)",
        title=f"KV spill: TTFT of a {result.get('history_tokens', '?')}-token prompt (median of {result.get('repeats', '?')})",
    )
    return _finish(fig, ax)


FIGURES: dict[str, Callable[[dict[str, Any]], Figure]] = {
    "semantic": semantic_figure,
    "routing": routing_figure,
    "kv": kv_figure,
}


def save_plot(kind: str, result: dict[str, Any], out: Path) -> Path:
    """Draw `kind` from a result and write it as PNG (the parent folder is created)."""
    fig = FIGURES[kind](result)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=DPI)
    plt.close(fig)
    return out


def _need(result: dict[str, Any], key: str, kind: str) -> Any:
    if not isinstance(result, dict) or not result.get(key):
        raise PlotInputError(f"{kind}: the JSON has no `{key}`; is it a `kvgate bench {kind} --json` result?")
    return result[key]


def _finish(fig: Figure, ax: Any, legend: str = "best") -> Figure:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc=legend)
    ax.title.set_fontsize(10)
    fig.tight_layout()
    return fig
