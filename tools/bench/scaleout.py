"""`kvgate bench scaleout`: several proxies on one Redis vs one proxy, vs several proxies each on
its own cache (the per-proxy baseline). One module per section, run in order, each adding its
key to the JSON (`SECTIONS`: another part of the scale-out work adds its section there):

  cache    (kvgate.tools.bench.scaleout_cache)  hit rate of 1 proxy, 3 on Redis, 3 local; hit p50s
  fault    (kvgate.tools.bench.scaleout_fault)  Redis SIGKILLed at 25 %, restarted empty at 50 %
  catchup  (kvgate.tools.bench.scaleout_catchup) start-up / catch-up time of a proxy's view, 10k / 100k
  routing  (kvgate.tools.bench.scaleout_routing) the routing arena: hit rate of 1 proxy, 3 on Redis, 3 alone
  kv       (kvgate.tools.bench.scaleout_kv)     the remote KV tier: warm TTFT from Redis vs cold, load GB/s vs raw GET

Every section gets a Context: the work dir, one fake backend (fixed answers: "Answer: <q>"),
a fresh Redis per section, the traffic's question pairs (QQP duplicates, separated), arguments.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgate.engines.demo import create_fake_app
from kvgate.index.responses.embedder import Embedder, make_embedder
from kvgate.tools.bench.machine import machine_info
from kvgate.tools.bench.procs import ServerThread
from kvgate.tools.bench.scaleout_traffic import QQP, duplicate_pairs, separated
from kvgate.tools.bench.stats import write_json

log = logging.getLogger("kvgate.bench.scaleout")
SECTIONS = {
    "cache": "kvgate.tools.bench.scaleout_cache",
    "fault": "kvgate.tools.bench.scaleout_fault",
    "catchup": "kvgate.tools.bench.scaleout_catchup",
    "routing": "kvgate.tools.bench.scaleout_routing",
    "kv": "kvgate.tools.bench.scaleout_kv",
}


@dataclass
class Context:
    work: Path
    api_base: str
    embedder: Embedder
    pairs: list[tuple[str, str]]
    args: argparse.Namespace


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of: {', '.join(SECTIONS)}")
    p.add_argument("--proxies", type=int, default=3, help="proxies in the scaled-out runs")
    p.add_argument("--requests", type=int, default=2000, help="requests per run (cache and fault sections)")
    p.add_argument("--pairs", type=int, default=800, help="QQP duplicate pairs in the traffic's pool")
    p.add_argument("--seed", type=int, default=14)
    p.add_argument("--catchup-sizes", default="10000,100000", help="entries for the catch-up section")
    p.add_argument("--work", type=Path, default=None, help="work dir (default: a temp dir)")
    p.add_argument(
        "--routing-trace",
        type=Path,
        default=Path("../shared/data/mooncake_conversation_trace.jsonl"),
        help="routing section: Mooncake-format trace replayed through the proxies",
    )
    p.add_argument("--routing-limit", type=int, default=800, help="routing section: the trace's first N requests")
    p.add_argument("--routing-speed", type=float, default=4.0, help="routing section: replay speed-up")


def main(args: argparse.Namespace) -> int:
    names = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        print(
            f"kvgate bench scaleout: error: --sections: unknown {', '.join(unknown)} (choose from {', '.join(SECTIONS)})",
            file=sys.stderr,
        )
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="kvgate-scaleout-"))
    work.mkdir(parents=True, exist_ok=True)
    embedder = make_embedder("onnx")
    pairs = separated(duplicate_pairs(QQP, 4 * args.pairs), embedder, separation=0.85, want=args.pairs)
    backend = ServerThread(create_fake_app()).start()
    ctx = Context(work, f"{backend.url}/v1", embedder, pairs, args)
    result: dict[str, Any] = {
        "bench": "scaleout",
        "machine": machine_info(),
        "proxies": args.proxies,
        "requests": args.requests,
        "pairs": len(pairs),
        "seed": args.seed,
    }
    try:
        for name in names:
            started = time.time()
            log.warning("scaleout: section %s", name)
            result[name] = importlib.import_module(SECTIONS[name]).run(ctx)
            result[name]["section_s"] = round(time.time() - started, 1)
            write_json(args.json, result)  # what is done survives a later section's failure
    finally:
        backend.stop()
    import json

    print(json.dumps(result, indent=2))
    return 0
