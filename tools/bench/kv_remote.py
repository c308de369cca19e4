"""`kvgate bench kv-remote`: the remote KV tier (kvgate.index.kv.chunks.redis), the figures of `bench kv` for it.

A throwaway redis-server (kvgate.tools.redis_proc, `maxmemory` + allkeys-lru as the README recommends)
and two in-process replica engines over one loaded SmolLM2-135M (greedy), each with its own RAM
and disk tiers (separate temporary directories, as on two machines) and the same Redis as the
remote tier:

    turn 1   replica A answers a ≈ --history-tokens conversation: its chunks (and its spilled
             partial tail) go to Redis
    cold     turn 2 (turn 1 + A's answer + a follow-up) on an engine without a store
    warm     turn 2 on replica B, its RAM, disk and RAM tails emptied and Redis put back to what
             turn 1 left before every run: the prefix comes from Redis

`ttft_cold_s` / `ttft_warm_remote_s` are the engine's own TTFTs (median over --repeats, runs
interleaved); `identical_output` compares the token ids of every run.

Load bandwidth, on the same Redis, same run, same keys (turn 2's loadable chunks), in bytes of
stored (encoded) chunks per second: `remote_load_gbps` = a ChunkStore with only the remote tier,
longest_prefix + get_many (one pipelined EXISTS, one pipelined GET, codec verification and the
tensors: what a replica's load costs without the promotion into its own tiers);
`raw_get_gbps` (the anchor) = a plain redis-py pipeline GET of the same keys, nothing else.
The two alternate, --io-repeats times each, median reported. `remote_load_promoting_gbps`: B's whole
store with its RAM and disk emptied (the load plus the copy into RAM; the copy onto disk runs in
the background, kvgate.index.kv.chunks.promoter, and is waited for before the next repeat). No figure is
pass/fail.
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

from kvgate.tools.bench.machine import hardware_info
from kvgate.tools.bench.records import fit, history
from kvgate.tools.bench.stats import write_json

GB = 1e9
FOLLOW_UP = "Which record mentions the largest number? Answer briefly."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `kvgate bench kv-remote`."""
    p.add_argument("--history-tokens", type=int, default=2000, help="target length of turn 1's prompt (tokens)")
    p.add_argument("--repeats", type=int, default=3, help="turn-2 runs per state (median reported)")
    p.add_argument("--io-repeats", type=int, default=5, help="timed loads / raw GETs (median reported)")
    p.add_argument("--max-tokens", type=int, default=16, help="answer length of each turn (greedy)")
    p.add_argument("--chunk-tokens", type=int, default=256)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--redis-maxmemory", default="4gb", help="the throwaway Redis's maxmemory (allkeys-lru)")
    p.add_argument("--dir", type=Path, default=None, help="where the replicas' disk tiers go (default: $TMPDIR)")
    p.add_argument("--json", type=Path, default=None)


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / GB if seconds > 0 else float("nan")


def time_loads(
    url: str, namespace: str, keys: list[str], hashes: list[int], b_store: Any, repeats: int
) -> dict[str, list[float]]:
    """Seconds per repeat of: the remote-tier load (ChunkStore over the RedisTier alone), the raw
    pipelined GET of the same keys (alternating with it), and B's whole store promoting."""
    import redis

    from kvgate.index.kv.chunks import ChunkStore
    from kvgate.index.kv.chunks.redis import RedisTier

    remote_only = ChunkStore([RedisTier(url)], namespace)
    raw = redis.Redis.from_url(url)
    raw_keys = [f"kvgate:{k}" for k in keys]
    out: dict[str, list[float]] = {"tier": [], "raw": [], "promoting": []}
    b_store.drain()
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            n = remote_only.longest_prefix(hashes)
            chunks = remote_only.get_many(hashes[:n])
            out["tier"].append(time.perf_counter() - t0)
            if len(chunks) != len(hashes):
                raise RuntimeError(f"remote tier returned {len(chunks)} of {len(hashes)} chunks")
            del chunks
            t0 = time.perf_counter()
            pipe = raw.pipeline(transaction=False)
            for k in raw_keys:
                pipe.get(k)
            values = pipe.execute()
            out["raw"].append(time.perf_counter() - t0)
            if any(v is None for v in values):
                raise RuntimeError("raw GET missed a chunk")
            del values
            b_store.clear("memory")
            b_store.clear("disk")
            t0 = time.perf_counter()
            n = b_store.longest_prefix(hashes)
            chunks = b_store.get_many(hashes[:n])
            out["promoting"].append(time.perf_counter() - t0)
            if len(chunks) != len(hashes):
                raise RuntimeError("B's store did not load every chunk from Redis")
            del chunks
            b_store.drain()  # its background disk copies must not overlap the next timed load
    finally:
        remote_only.close()
        raw.close()
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole benchmark; returns the JSON-ready result (ValueError for bad options)."""
    if args.history_tokens < 2 * args.chunk_tokens:
        raise ValueError(f"--history-tokens must be at least 2 chunks ({2 * args.chunk_tokens})")
    if args.repeats < 1 or args.io_repeats < 1:
        raise ValueError("--repeats and --io-repeats must be >= 1")
    import redis
    import torch

    from kvgate.engines.replica.engine import ReplicaEngine
    from kvgate.engines.replica.kv_io import loadable_chunks
    from kvgate.engines.replica.model import load_model, model_namespace
    from kvgate.index.kv.chunks import ChunkStore, DiskTier, MemoryTier, chunk_hashes
    from kvgate.index.kv.chunks.allocator import keep_freed_memory
    from kvgate.index.kv.chunks.redis import RedisTier
    from kvgate.tools.redis_proc import RedisServer

    log = lambda msg: print(f"[kv-remote] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    if args.threads:
        torch.set_num_threads(args.threads)
    keep_freed_memory()
    t_start = time.perf_counter()
    model, tokenizer = load_model(args.model)
    ns = model_namespace(model)
    work = Path(tempfile.mkdtemp(prefix="kvgate-bench-kv-remote-", dir=args.dir))
    server = RedisServer(maxmemory=args.redis_maxmemory).start()
    made: list[Any] = []

    def replica(name: str | None) -> Any:
        store = None
        if name is not None:
            store = ChunkStore([MemoryTier(4 << 30), DiskTier(work / name, 16 << 30), RedisTier(server.url)], ns)
            made.append(store)
        engine = ReplicaEngine(model, tokenizer, store, chunk_tokens=args.chunk_tokens)
        made.append(engine)
        return engine

    try:
        a, b, cold = replica("a"), replica("b"), replica(None)
        raw = redis.Redis.from_url(server.url)
        ct = args.chunk_tokens
        turn1, _ = fit(history, lambda m: len(a.tokens(m)), args.history_tokens, hi=max(4, args.history_tokens // 4))
        for e in (a, b, cold):
            e.generate([{"role": "user", "content": "hi"}], max_tokens=1)  # first forward is slow
        first = a.generate(turn1, max_tokens=args.max_tokens)
        turn2 = turn1 + [{"role": "assistant", "content": first.text}, {"role": "user", "content": FOLLOW_UP}]
        tokens = a.tokens(turn2)
        hashes = chunk_hashes(tokens, ct)[: loadable_chunks(len(tokens), ct)]
        keys = [b.store.key(h) for h in hashes]
        snapshot = {k: raw.get(k) for k in raw.keys("*")}  # what turn 1 left in Redis
        in_redis = sum(1 for k in keys if f"kvgate:{k}".encode() in snapshot)
        log(
            f"turn 2: {len(tokens)} tokens, {len(hashes)} loadable chunks, {in_redis} in Redis after turn 1; "
            f"{torch.get_num_threads()} torch threads"
        )

        def restore_redis() -> None:
            raw.flushdb()
            pipe = raw.pipeline(transaction=False)
            for k, v in snapshot.items():
                pipe.set(k, v)
            pipe.execute()

        runs: dict[str, list[Any]] = {"cold": [], "warm_remote": []}
        for r in range(args.repeats):
            cold.tails.clear()
            runs["cold"].append(cold.generate(turn2, max_tokens=args.max_tokens))
            restore_redis()
            b.store.clear("memory")
            b.store.clear("disk")
            b.tails.clear()
            runs["warm_remote"].append(b.generate(turn2, max_tokens=args.max_tokens))
            b.store.drain()  # B's background disk copies finish before the next timed run
            log(
                f"repeat {r + 1}/{args.repeats}: cold {runs['cold'][-1].ttft_s * 1000:.0f} ms, "
                f"warm from Redis {runs['warm_remote'][-1].ttft_s * 1000:.0f} ms "
                f"({runs['warm_remote'][-1].cached_tokens} cached tokens)"
            )
        restore_redis()
        stored_bytes = sum(len(snapshot[f"kvgate:{k}".encode()]) for k in keys)
        loads = time_loads(server.url, ns, keys, hashes, b.store, args.io_repeats)
        raw.close()
    finally:
        for thing in reversed(made):
            thing.close()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    answers = [c for mode in runs.values() for c in mode]
    identical = all(c.token_ids == answers[0].token_ids for c in answers)
    ttft_cold = _median([c.ttft_s for c in runs["cold"]])
    ttft_warm = _median([c.ttft_s for c in runs["warm_remote"]])
    remote_gbps, raw_gbps = _gbps(stored_bytes, _median(loads["tier"])), _gbps(stored_bytes, _median(loads["raw"]))
    return {
        "kv": {
            "remote_load_gbps": remote_gbps,
            "raw_get_gbps": raw_gbps,
            "ttft_cold_s": ttft_cold,
            "ttft_warm_remote_s": ttft_warm,
            "identical_output": identical,
        },
        "remote_vs_raw": remote_gbps / raw_gbps,
        "warm_remote_speedup": ttft_cold / ttft_warm,
        "remote_load_promoting_gbps": _gbps(stored_bytes, _median(loads["promoting"])),
        "load_runs_s": loads,
        "ttft_cold_runs_s": [c.ttft_s for c in runs["cold"]],
        "ttft_warm_remote_runs_s": [c.ttft_s for c in runs["warm_remote"]],
        "warm_load_s": _median([c.load_s for c in runs["warm_remote"]]),
        "warm_prefill_s": _median([c.prefill_s for c in runs["warm_remote"]]),
        "prompt_tokens": len(tokens),
        "cached_tokens_warm": runs["warm_remote"][0].cached_tokens,
        "loaded_chunks": len(hashes),
        "chunk_tokens": ct,
        "stored_bytes": stored_bytes,
        "value_bytes": stored_bytes // max(1, len(keys)),
        "repeats": args.repeats,
        "io_repeats": args.io_repeats,
        "max_tokens": args.max_tokens,
        "model": ns,
        "torch_threads": torch.get_num_threads(),
        "redis": {"maxmemory": args.redis_maxmemory, "policy": "allkeys-lru", "where": "127.0.0.1 (loopback)"},
        "answer_text": answers[0].text,
        "machine": hardware_info(work.parent),
        "wall_s": time.perf_counter() - t_start,
    }


def main(args: argparse.Namespace) -> int:
    """Run, print the summary, write --json; 0 on success, 2 on bad options."""
    try:
        result = run(args)
    except ValueError as exc:
        print(f"kvgate bench kv-remote: error: {exc}", file=sys.stderr)
        return 2
    kv = result["kv"]
    print(
        f"turn 2: {result['prompt_tokens']} tokens, {result['loaded_chunks']} chunks of {result['chunk_tokens']} "
        f"({result['value_bytes'] / 1e6:.1f} MB each), median of {result['repeats']}"
    )
    print(
        f"TTFT cold {kv['ttft_cold_s'] * 1000:.0f} ms, warm from Redis {kv['ttft_warm_remote_s'] * 1000:.0f} ms "
        f"({result['warm_remote_speedup']:.1f}x, {result['cached_tokens_warm']} cached tokens); "
        f"identical output: {kv['identical_output']}"
    )
    print(
        f"load GB/s: remote tier {kv['remote_load_gbps']:.2f}, raw pipelined GET {kv['raw_get_gbps']:.2f} "
        f"(tier/raw {result['remote_vs_raw']:.2f}); with promotion into RAM+disk "
        f"{result['remote_load_promoting_gbps']:.2f}"
    )
    write_json(args.json, result)
    return 0
