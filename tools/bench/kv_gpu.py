"""`kvgate bench kv-gpu`: the vLLM KV connector's worker data path at device speed, without vLLM.

It drives the connector's own worker classes (engines/vllm/kv_connector: PagedKV, Loader, Saver,
StagingPool, the gate; they import torch, never vLLM) against KV caches in vLLM 0.32's GPU layout,
kvgate's real chunk store (memory tier; disk tier in a temporary directory, page cache dropped
before each timed read) and, in the same run, a Llama-shaped torch model with random weights
(bf16, SDPA) whose prefill a load replaces. On CUDA when present; `--quick` shrinks the shapes
and histories so a CPU test runs it in seconds.

Per shape, codec, tier and history: load GB/s (bf16-equivalent and as moved), cold prefill of
history + suffix, load + suffix prefill, what the gate chose from the estimates it had by then,
and the better of the two. Also: raw sequential disk read GB/s, pinned staging allocations after
warm-up (zero expected), and the share of an 8k prefill the save copy-out adds to the forward path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from kvgate.tools.bench.kv_gpu_breakdown import bus_gbps
from kvgate.tools.bench.kv_gpu_cells import Plan, gbps, run_shape
from kvgate.tools.bench.kv_gpu_model import SHAPES, quick
from kvgate.tools.bench.pagecache import PageCache

HISTORIES = [512, 2048, 8192, 32768]
QUICK_HISTORIES = [64, 128]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `kvgate bench kv-gpu`."""
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    p.add_argument("--quick", action="store_true", help="small shapes and histories (a CPU test)")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {list(SHAPES)}")
    p.add_argument(
        "--histories",
        default=None,
        help=f"comma-separated history lengths in tokens (default {HISTORIES}, quick {QUICK_HISTORIES})",
    )
    p.add_argument("--codecs", default="raw,int8,int4")
    p.add_argument(
        "--suffix", type=int, default=None, help="tokens prefilled after the history (default 128, quick 16)"
    )
    p.add_argument("--reps", type=int, default=2, help="timed repeats per measurement, after one warm-up (median)")
    p.add_argument(
        "--chunk-blocks",
        type=int,
        default=None,
        help="engine blocks per chunk (default: the connector's auto rule, at least 128 tokens and 1 MiB; quick 2)",
    )
    p.add_argument("--staging-mb", type=int, default=2048, help="the staging pool (the connector's staging_mb)")
    p.add_argument("--budget-s", type=float, default=420.0, help="cells that would start later are skipped, and listed")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dir", type=Path, default=None, help="where the disk tier's temporary directory goes")
    p.add_argument("--drop-page-cache", default="auto", choices=["auto", "fadvise", "global", "none"])


def raw_disk_read_gbps(directory: Path, nbytes: int, cache: PageCache) -> float:
    """Sequential read of one fresh file of `nbytes`, page cache dropped first."""
    path = directory / "raw-read.bin"
    block = os.urandom(8 << 20)
    with open(path, "wb") as f:
        for _ in range(max(1, nbytes // len(block))):
            f.write(block)
    cache.drop([path])
    t0 = time.perf_counter()
    total = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(8 << 20):
            total += len(chunk)
    seconds = time.perf_counter() - t0
    path.unlink()
    return gbps(total, seconds)


def chunk_blocks_for(shape: Any, asked: int | None, is_quick: bool) -> int:
    """The connector's own auto rule unless asked (16-token blocks: at least 128 tokens and 1 MiB)."""
    from kvgate.engines.vllm.kv_connector.settings import chunk_blocks, parse

    if asked or is_quick:
        return asked or 2
    settings = parse({"tiers": {"disk": {"path": "/unused"}}})
    return chunk_blocks(settings, shape.kv_bytes_per_token * 16, 16)


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    histories = [
        int(h) for h in (args.histories or ",".join(map(str, QUICK_HISTORIES if args.quick else HISTORIES))).split(",")
    ]
    suffix = args.suffix or (16 if args.quick else 128)
    cache = PageCache(args.drop_page_cache)
    started = time.monotonic()
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "quick": args.quick,
        "cells": [],
        "skipped": [],
    }
    bus = bus_gbps(device)
    out.update(bus)
    with tempfile.TemporaryDirectory(prefix="kvgate-kv-gpu-", dir=args.dir) as tmp:
        work = Path(tmp)
        out["raw_disk_read_gbps"] = raw_disk_read_gbps(work, (16 << 20) if args.quick else (2 << 30), cache)
        allocs, exact, save_paths = 0, True, {}
        for name in args.shapes.split(","):
            shape = quick(SHAPES[name]) if args.quick else SHAPES[name]
            plan = Plan(
                histories,
                args.codecs.split(","),
                suffix,
                args.reps,
                chunk_blocks_for(shape, args.chunk_blocks, args.quick),
                work,
                cache,
                started + args.budget_s,
                staging_bytes=args.staging_mb << 20,
                h2d_gbps=bus.get("h2d_pinned_gbps"),
            )
            try:
                res = run_shape(shape, device, plan)
            except Exception as e:  # the other shape's figures still count
                out["skipped"].append(f"{name}: {type(e).__name__}: {e}")
                continue
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            out["cells"] += res.cells
            out["skipped"] += res.skipped
            allocs += res.steady_allocs
            exact &= res.raw_exact
            save_paths[name] = res.save_path
    first = next((v for v in save_paths.values() if v), None)
    out.update(
        pinned_allocs_steady=allocs,
        save_path_fraction_8k=first["fraction"] if first else None,
        save_path_fraction_history=first["history_tokens"] if first else None,
        save_path=save_paths,
        raw_loads_exact=exact,
        page_cache=cache.report(),
        seconds=round(time.monotonic() - started, 1),
    )
    return out


def main(args: argparse.Namespace) -> int:
    result = run(args)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text)
    for c in result["cells"]:
        print(
            f"{c['shape']:16} {c['tier']:6} {c['codec']:4} {c['history_tokens']:6}  load {c['load_gbps_bf16_equiv']:7.2f} "
            f"GB/s bf16-eq  prefill {c['prefill_s']:.4f}s  load+suffix {c['load_plus_suffix_s']:.4f}s  "
            f"gate {c['gate_choice']}",
            file=sys.stderr,
        )
    print(
        f"raw disk {result['raw_disk_read_gbps']} GB/s; pinned h2d {result.get('h2d_pinned_gbps')} GB/s; "
        f"save path {result['save_path_fraction_8k']} of a {result['save_path_fraction_history']}-token prefill; "
        f"steady pinned allocations {result['pinned_allocs_steady']}; {result['seconds']} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":  # the GPU machine has torch but no kvgate install: `python3 -m kvgate.tools.bench.kv_gpu`
    parser = argparse.ArgumentParser(prog="python -m kvgate.tools.bench.kv_gpu", description=__doc__.split("\n")[0])
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
