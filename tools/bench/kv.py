"""`kvgate bench kv`: what the KV chunk store saves on one long prompt, in process.

One ReplicaEngine (the packaged SmolLM2-135M, greedy) over a real ChunkStore (MemoryTier +
DiskTier in a temporary directory) answers the same ≈ --history-tokens-token conversation in
four stored states, rebuilt identically before every run (clear every tier, then put back the
same encoded prefix chunks):

    cold            nothing stored: the whole prompt is prefilled
    warm_ram        the prompt's prefix chunks in the memory tier (and the disk tier), the
                    partial chunk after them in the engine's RAM tail cache
    warm_disk       memory tier and RAM tails emptied, page cache dropped: the chunks and the
                    spilled tail (engines/replica/tails.py) come from the disk tier's files
    warm_disk_pagecache  the same with the files still in the page cache (what a replica sees
                    for chunks written or read recently)

TTFT and its load/prefill parts are the engine's own timings (Completion.ttft_s / load_s /
prefill_s); each mode's figure is the median over --repeats runs, runs interleaved mode by mode.
`identical_output` compares the greedy answer (token ids and text) of every run.

Load bandwidth, in bytes of decoded tensors per second: `disk_load_gbps` = store.get_many of the
same chunks with the memory tier cleared (DiskTier.get + decode_chunk: SQLite row, file read
into a fresh buffer, XXH3 check, no copy; plus the promotion into the memory tier), `ram_load_gbps` = get_many served by the memory tier (decode only), and
`raw_disk_read_gbps` = a plain sequential read in 8 MiB blocks of one file of the chunks' total
size in the same directory. Before every disk read the page cache is dropped "where possible":
`sync`, then posix_fadvise(DONTNEED) on every file concerned, then (if we may: root) writing 1 to
/proc/sys/vm/drop_caches. The JSON says which methods ran and how many bytes of the files were
still resident afterwards (mincore). `disk_read_gbps` / `decode_gbps` split disk_load_gbps into
DiskTier.get alone (encoded bytes/s) and decode_chunk alone (checksum + views). No figure is
pass/fail.

Here: the options, the four stored states and the summary. The deterministic prompt text is
kvgate.tools.bench.records, the page-cache drop kvgate.tools.bench.pagecache, the load timings kvgate.tools.bench.kv_loads.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from kvgate.middleware.progress import progress, say
from kvgate.tools.bench.kv_loads import READ_BLOCK, time_chunk_loads, time_raw_reads
from kvgate.tools.bench.machine import hardware_info
from kvgate.tools.bench.pagecache import PageCache, files_under
from kvgate.tools.bench.plot import add_plot_option, write_plot
from kvgate.tools.bench.records import fit, history, sentences
from kvgate.tools.bench.stats import write_json

__all__ = ["MODES", "add_arguments", "fit", "history", "main", "mode_summary", "print_summary", "run", "sentences"]

GB = 1e9
MODES = ("cold", "warm_ram", "warm_disk", "warm_disk_pagecache")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `kvgate bench kv`."""
    p.add_argument("--history-tokens", type=int, default=2000, help="target prompt length (tokens)")
    p.add_argument("--repeats", type=int, default=3, help="runs per stored state (median reported)")
    p.add_argument("--io-repeats", type=int, default=5, help="timed chunk loads / raw reads (median reported)")
    p.add_argument("--max-tokens", type=int, default=16, help="answer length (greedy)")
    p.add_argument("--chunk-tokens", type=int, default=256)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--exact-prefill", action="store_true", help="the engine's exact_prefill (bit-identical warm logits)"
    )
    p.add_argument(
        "--dir", type=Path, default=None, help="where the store's temporary directory goes (default: $TMPDIR)"
    )
    p.add_argument(
        "--drop-page-cache",
        default="auto",
        choices=["auto", "fadvise", "global", "none"],
        help="auto: posix_fadvise, then /proc/sys/vm/drop_caches where writable (global: only the latter)",
    )
    p.add_argument("--json", type=Path, default=None)
    add_plot_option(p)


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / GB if seconds > 0 else float("nan")


def mode_summary(cs: list[Any]) -> dict[str, Any]:
    """Medians and per-run figures of one stored state's runs (engine Completions)."""
    return {
        "ttft_s": _median([c.ttft_s for c in cs]),
        "load_s": _median([c.load_s for c in cs]),
        "prefill_s": _median([c.prefill_s for c in cs]),
        "ttft_runs_s": [c.ttft_s for c in cs],
        "load_runs_s": [c.load_s for c in cs],
        "prefill_runs_s": [c.prefill_s for c in cs],
        "cached_tokens": cs[0].cached_tokens,
        "prefilled_tokens": cs[0].prompt_tokens - cs[0].cached_tokens,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole benchmark; returns the JSON-ready result (ValueError for bad options)."""
    if args.history_tokens < 2 * args.chunk_tokens:
        raise ValueError(f"--history-tokens must be at least 2 chunks ({2 * args.chunk_tokens})")
    if args.repeats < 1 or args.io_repeats < 1:
        raise ValueError("--repeats and --io-repeats must be >= 1")
    import torch

    from kvgate.engines.replica.engine import ReplicaEngine
    from kvgate.engines.replica.model import load_model, model_namespace
    from kvgate.index.kv.chunks import ChunkStore, DiskTier, MemoryTier, chunk_hashes

    log = say("kv")
    if args.threads:
        torch.set_num_threads(args.threads)
    from kvgate.index.kv.chunks.allocator import keep_freed_memory

    keep_freed_memory()  # as `kvgate replica` does at start
    t_start = time.perf_counter()
    model, tokenizer = load_model(args.model)
    work = Path(tempfile.mkdtemp(prefix="kvgate-bench-kv-", dir=args.dir))
    disk_dir = work / "kv"
    memory, disk = MemoryTier(4 << 30), DiskTier(disk_dir, 16 << 30)
    store = ChunkStore([memory, disk], namespace=model_namespace(model))
    engine = None
    cache = PageCache(args.drop_page_cache)
    try:
        engine = ReplicaEngine(
            model, tokenizer, store, chunk_tokens=args.chunk_tokens, exact_prefill=args.exact_prefill
        )
        ct = args.chunk_tokens
        messages, n_prompt = fit(
            history, lambda m: len(engine.tokens(m)), args.history_tokens, hi=max(4, args.history_tokens // 4)
        )
        tokens = engine.tokens(messages)
        hashes = chunk_hashes(tokens, ct)[: (n_prompt - 1) // ct]  # what the engine can load
        log(
            f"prompt: {n_prompt} tokens, {len(hashes)} loadable chunks of {ct}; model {engine.namespace}, "
            f"{torch.get_num_threads()} torch threads, store in {work}"
        )

        def generate() -> Any:
            return engine.generate(messages, max_tokens=args.max_tokens)

        engine.generate([{"role": "user", "content": "hi"}], max_tokens=1)  # first forward is slow
        store.clear()
        generate()  # warm-up at full length; leaves the prefix chunks stored
        snapshot = [(store.key(h), memory.get(store.key(h))) for h in hashes]
        tails = engine.tails.snapshot()  # the partial chunk after the last full one (RAM part)
        if any(data is None for _, data in snapshot):
            raise RuntimeError("the warm-up run did not store the prompt's prefix chunks (store budget too small?)")
        stored_bytes = sum(len(d) for _, d in snapshot)
        on_disk = [(key, bytes(disk.get(key) or b"")) for key in disk.keys()]  # chunks + the spilled tail

        def rebuild(memory_too: bool) -> None:
            store.clear()
            engine.tails.clear()
            for key, data in on_disk:
                disk.put(key, data)
            for key, data in snapshot if memory_too else ():
                memory.put(key, data)
            if memory_too:
                engine.tails.restore(tails)

        runs: dict[str, list[Any]] = {m: [] for m in MODES}
        for r in progress(range(args.repeats), "kv: stored states timed", unit="repeats"):
            for mode in MODES:
                if mode == "cold":
                    store.clear()
                    engine.tails.clear()
                else:
                    rebuild(memory_too=mode == "warm_ram")
                    if mode == "warm_disk":
                        cache.drop(files_under(disk_dir))
                runs[mode].append(generate())
            c = {m: runs[m][-1] for m in MODES}
            log(f"repeat {r + 1}/{args.repeats}: " + "  ".join(f"{m} {c[m].ttft_s * 1000:.0f} ms" for m in MODES))

        # chunk load bandwidth: disk tier (page cache dropped), memory tier; then a raw file read
        rebuild(memory_too=False)
        loads = time_chunk_loads(store, memory, disk, hashes, snapshot, disk_dir, cache, args.io_repeats)
        raw_s = time_raw_reads(work / "raw.bin", snapshot, cache, args.io_repeats)
    finally:
        if engine is not None:
            engine.close()
        store.close()
        shutil.rmtree(work, ignore_errors=True)

    modes = {m: mode_summary(runs[m]) for m in MODES}
    answers = [c for m in MODES for c in runs[m]]
    reference = answers[0]
    identical = all(c.token_ids == reference.token_ids and c.text == reference.text for c in answers)
    disk_gbps = _gbps(loads.decoded, _median(loads.disk_s))
    raw_gbps = _gbps(stored_bytes, _median(raw_s))
    cold, ram, dsk = (modes[m]["ttft_s"] for m in ("cold", "warm_ram", "warm_disk"))
    return {
        "history_tokens": n_prompt,
        "requested_history_tokens": args.history_tokens,
        "chunk_tokens": args.chunk_tokens,
        "loaded_chunks": len(hashes),
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "model": engine.namespace,
        "exact_prefill": args.exact_prefill,
        "torch_threads": torch.get_num_threads(),
        "ttft_cold_s": cold,
        "ttft_warm_ram_s": ram,
        "ttft_warm_disk_s": dsk,
        "ttft_warm_disk_pagecache_s": modes["warm_disk_pagecache"]["ttft_s"],
        "warm_ram_speedup": cold / ram,
        "warm_disk_speedup": cold / dsk,
        "modes": modes,
        "identical_output": identical,
        "answer_text": reference.text,
        "answer_token_ids": list(reference.token_ids),
        "stored_bytes": stored_bytes,
        "decoded_bytes": loads.decoded,
        "disk_load_gbps": disk_gbps,
        "disk_load_runs_s": loads.disk_s,
        "ram_load_gbps": _gbps(loads.decoded, _median(loads.ram_s)),
        "ram_load_runs_s": loads.ram_s,
        "disk_read_gbps": _gbps(stored_bytes, _median(loads.get_s)),
        "disk_read_runs_s": loads.get_s,
        "decode_gbps": _gbps(loads.decoded, _median(loads.decode_s)),
        "decode_runs_s": loads.decode_s,
        "raw_disk_read_gbps": raw_gbps,
        "raw_disk_read_runs_s": raw_s,
        "raw_read_block_bytes": READ_BLOCK,
        "disk_vs_raw": disk_gbps / raw_gbps,
        "page_cache": cache.report(),
        "machine": hardware_info(work.parent),
        "wall_s": time.perf_counter() - t_start,
    }


def main(args: argparse.Namespace) -> int:
    """Run, print the summary, write --json; 0 on success, 2 on bad options."""
    try:
        result = run(args)
    except ValueError as exc:
        print(f"kvgate bench kv: error: {exc}", file=sys.stderr)
        return 2
    print_summary(result)
    write_json(args.json, result)
    return write_plot("kv", args.plot, result)


def print_summary(result: dict[str, Any]) -> None:
    """TTFT per stored state, load bandwidths, whether the page cache was dropped."""
    m = result["modes"]
    print(
        f"prompt {result['history_tokens']} tokens, {result['loaded_chunks']} chunks of {result['chunk_tokens']} "
        f"loadable ({result['stored_bytes'] / 1e6:.0f} MB), median of {result['repeats']}"
    )
    print(f"{'state':22s} {'ttft':>9s} {'load':>9s} {'prefill':>9s} {'cached':>7s} {'speedup':>8s}")
    for name in MODES:
        s = m[name]
        print(
            f"{name:22s} {s['ttft_s'] * 1000:7.0f}ms {s['load_s'] * 1000:7.0f}ms {s['prefill_s'] * 1000:7.0f}ms "
            f"{s['cached_tokens']:7d} {result['ttft_cold_s'] / s['ttft_s']:7.2f}x"
        )
    pc = result["page_cache"]
    print(
        f"load GB/s: disk tier {result['disk_load_gbps']:.2f} (its reads {result['disk_read_gbps']:.2f}, decode "
        f"{result['decode_gbps']:.2f})  raw file read {result['raw_disk_read_gbps']:.2f} (disk/raw "
        f"{result['disk_vs_raw']:.2f})  memory tier {result['ram_load_gbps']:.2f}"
    )
    print(
        f"page cache dropped: {', '.join(pc['methods']) or 'no'} (resident after drop: {pc['max_resident_bytes_after_drop']} B)"
        f"; identical output: {result['identical_output']}"
    )
