"""`kvgate bench semantic`: semantic-cache precision/recall vs GPTCache, and proxy latency at size.

Two modes, one required:

* `--pairs FILE.csv` (columns question1, question2, is_duplicate): every question1 goes into one
  scope of a SemanticIndex, every question2 is looked up (top-1). A hit (similarity >= threshold)
  is correct when it returns that pair's own entry and the pair is a duplicate, or another pair's
  entry whose question is the same text or linked to the new one by labelled duplicates (never
  when the file labels the two non-duplicate; kvgate.tools.tuning.equivalence);
  precision = correct hits / hits, recall = correct hits on duplicate pairs / duplicate pairs. A threshold sweep comes
  from the same top-1 results. Lookup latency (one embedding + one search, one query at a time)
  is measured on the first --latency-queries question2. GPTCache runs on the same pairs with the
  same embedder (kvgate.tools.bench.gptcache_anchor) and is scored by the same code.
* `--entries N`: proxy-level latency with N entries in the scope (kvgate.tools.bench.proxy_latency);
  `--filler real` (default: real questions and variants, embeddings cached on disk) or `random`.

Results go to --json (indent 2); a summary table goes to stdout, progress to stderr.

Modules: cli (options, checks, `add_arguments` / `main` for middleware/cli.py), scoring (pure),
pairs_run, verified_run, anchor_run, proxy_run (the runs), report (tables, JSON, progress).
"""

from __future__ import annotations

from kvgate.tools.bench.machine import machine_info
from kvgate.tools.bench.semantic.cli import (
    DEFAULT_LATENCY_QUERIES,
    DEFAULT_PAIRS_THRESHOLD,
    DEFAULT_PROXY_QUERIES,
    DEFAULT_PROXY_THRESHOLD,
    add_arguments,
    main,
)
from kvgate.tools.bench.semantic.pairs_run import SCOPE, SWEEP, embed_batched, holdout_pairs, run_pairs
from kvgate.tools.bench.semantic.proxy_run import run_proxy
from kvgate.tools.bench.semantic.report import print_pairs_summary, print_proxy_summary, progress, write_json
from kvgate.tools.bench.semantic.scoring import TopHit, score, score_returned
from kvgate.tools.tuning.pairs import BenchInputError, Pair, read_pairs

__all__ = [
    "DEFAULT_LATENCY_QUERIES",
    "DEFAULT_PAIRS_THRESHOLD",
    "DEFAULT_PROXY_QUERIES",
    "DEFAULT_PROXY_THRESHOLD",
    "SCOPE",
    "SWEEP",
    "BenchInputError",
    "Pair",
    "TopHit",
    "add_arguments",
    "embed_batched",
    "holdout_pairs",
    "machine_info",
    "main",
    "print_pairs_summary",
    "print_proxy_summary",
    "progress",
    "read_pairs",
    "run_pairs",
    "run_proxy",
    "score",
    "score_returned",
    "write_json",
]
