"""`kvgate bench routing`: the routing arena.

Replays a Mooncake-format trace at its timestamps (÷ speed) against N simulated replicas
(`kvgate sim-replica`, text tokenizer: one token per character), once through kvgate's proxy per
policy and once through sglang-router (`--policy cache_aware`) on the same replicas, resetting the
replicas' caches between runs. Each request streams; TTFT is the time to the first content chunk
as the client sees it, router included. Hit rate comes from the replicas' own counters (cached
prompt tokens / prompt tokens), so every router is judged by the same engine model. Ceilings replay
the same requests in order through one LRU prefix cache: unlimited (`ceiling_infinite`) and with
the replicas' total capacity (`ceiling_lru`).
"""
from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tools.bench.procs import Proc, free_port, kvgate_argv, sglang_router_bin
from tools.bench.stats import pct, write_json
from tools.bench.trace import TraceRequest, load_trace, prompt_text
from engines.sim.engine import PrefixCache, SimEngine

KVGATE_POLICIES = ("round_robin", "least_loaded", "cache_aware", "cache_aware_precise", "affinity")
BLOCK_SIZE = 16


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", type=Path, required=True, help="Mooncake-format JSONL trace")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--capacity-tokens", type=int, default=1_500_000, help="prefix cache per replica (tokens = characters)")
    p.add_argument("--speed", type=float, default=5.0, help="replay speed-up over the trace's timestamps")
    p.add_argument("--limit", type=int, default=2000, help="first N requests of the trace (0 = all)")
    p.add_argument("--policies", default="round_robin,least_loaded,cache_aware,sglang",
                   help=f"comma list of {','.join(KVGATE_POLICIES)},sglang")
    p.add_argument("--prefill-tps", type=float, default=None, help="per replica; default 12k × speed")
    p.add_argument("--decode-tps", type=float, default=None, help="per request; default 60 × speed")
    p.add_argument("--max-output-tokens", type=int, default=256, help="cap on a request's output_length")
    p.add_argument("--block-tokens", type=int, default=512, help="tokens per trace hash id")
    p.add_argument("--routing", action="append", default=[], metavar="KEY=VALUE",
                   help="extra kvgate routing option for every kvgate policy (repeatable), e.g. miss_weight=1.5")
    p.add_argument("--json", type=Path, default=None)




def ceilings(prompts: list[str], total_capacity_tokens: int) -> dict[str, float]:
    """Hit rate of one unlimited and one bounded LRU cache over the requests in order."""
    engine = SimEngine(capacity_tokens=1, block_size=BLOCK_SIZE, prefill_tps=1, decode_tps=1)
    unlimited, bounded = PrefixCache(10**12), PrefixCache(total_capacity_tokens // BLOCK_SIZE)
    tokens = hit_inf = hit_lru = 0
    for text in prompts:
        req = engine.request([{"role": "user", "content": text}])
        matchable = req.hashes[: max(0, (req.prompt_tokens - 1) // BLOCK_SIZE)]
        tokens += req.prompt_tokens
        hit_inf += unlimited.match(matchable) * BLOCK_SIZE
        hit_lru += bounded.match(matchable) * BLOCK_SIZE
        unlimited.insert(req.hashes)
        bounded.insert(req.hashes)
    return {"ceiling_infinite": hit_inf / tokens, "ceiling_lru": hit_lru / tokens}


async def replay(url: str, trace: list[TraceRequest], prompts: list[str], speed: float, max_out: int,
                 headers: dict[str, str]) -> dict[str, Any]:
    """Send every request at its (scaled) time; TTFT per request, errors counted, never raised."""
    ttfts: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        start = time.perf_counter()
        t0 = trace[0].timestamp_ms

        async def one(req: TraceRequest, text: str) -> None:
            await asyncio.sleep(max(0.0, (req.timestamp_ms - t0) / 1000 / speed - (time.perf_counter() - start)))
            body = {"model": "sim", "messages": [{"role": "user", "content": text}], "stream": True,
                    "max_tokens": max(1, min(req.output_length, max_out))}
            sent = time.perf_counter()
            first = None
            try:
                async with client.stream("POST", url, json=body, headers=headers) as resp:
                    if resp.status_code != 200:
                        errors.append(f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
                        return
                    async for line in resp.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        if '"error"' in line[:20]:
                            errors.append(line[:200])
                            return
                        if first is None and '"content"' in line:
                            first = time.perf_counter() - sent
            except httpx.HTTPError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                return
            if first is None:
                errors.append("stream ended without content")
            else:
                ttfts.append(first)

        await asyncio.gather(*(one(r, p) for r, p in zip(trace, prompts)))
        wall = time.perf_counter() - start
    return {"ttfts": ttfts, "errors": errors, "wall_s": wall}


def replica_stats(urls: list[str]) -> list[dict[str, Any]]:
    return [httpx.get(f"{u}/stats", timeout=10).json() for u in urls]


def summarise(run: dict[str, Any], stats: list[dict[str, Any]]) -> dict[str, Any]:
    prompt = sum(s["prompt_tokens"] for s in stats)
    cached = sum(s["cached_tokens"] for s in stats)
    reqs = [s["requests"] for s in stats]
    t = run["ttfts"]
    return {
        "hit_rate": cached / prompt if prompt else 0.0,
        "ttft_mean_s": statistics.fmean(t) if t else float("nan"),
        "ttft_p50_s": pct(t, 0.5), "ttft_p99_s": pct(t, 0.99),
        "imbalance": max(reqs) / statistics.fmean(reqs) if sum(reqs) else float("nan"),
        "errors": len(run["errors"]), "error_samples": run["errors"][:3],
        "requests_per_replica": reqs, "completed": len(t), "wall_s": run["wall_s"],
    }


def kvgate_config(policy: str, replicas: list[str], capacity_tokens: int, cache_dir: str,
                  events: list[str] | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Both cache tiers off (every request is routed); the sim caches prompts only, so
    record_answers is off. `cache_aware_precise` follows the replicas' KV events instead."""
    precise = policy == "cache_aware_precise"
    routing = {"policy": "cache_aware" if precise else policy, "block_size": BLOCK_SIZE, "tokenizer": "text",
               "capacity_blocks": capacity_tokens // BLOCK_SIZE, "max_attempts": 2, "record_answers": False,
               "mode": "precise" if precise else "approximate", **(extra or {})}
    replica_cfg = [{"name": f"r{i}", "api_base": f"{u}/v1"} for i, u in enumerate(replicas)]
    if precise:
        for r, e in zip(replica_cfg, events or []):
            r["events"] = e
    return {
        "cache_dir": cache_dir,
        "routes": [{
            "name": "arena", "model": "*",
            "backend": {"model": "openai/sim", "api_key": "none", "timeout": 600},
            "exact": False, "semantic": {"enabled": False},  # every request must be routed
            "replicas": replica_cfg,
            "routing": routing,
        }],
        "server": {"max_body_bytes": 64 * 1024 * 1024},
    }


def run_arena(args: argparse.Namespace) -> dict[str, Any]:
    trace = load_trace(args.trace, args.limit or None)
    prompts = [prompt_text(r, args.block_tokens) for r in trace]
    speed = args.speed
    prefill = args.prefill_tps or 12_000 * speed
    decode = args.decode_tps or 60 * speed
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        if p not in (*KVGATE_POLICIES, "sglang"):
            raise SystemExit(f"kvgate bench routing: unknown policy {p!r}")
    span = (trace[-1].timestamp_ms - trace[0].timestamp_ms) / 1000
    log = lambda msg: print(f"[arena] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    log(f"{len(trace)} requests over {span:.0f}s of trace → {span / speed:.0f}s per policy at speed {speed:g}")
    result: dict[str, Any] = {
        "trace": str(args.trace), "requests": len(trace), "replicas": args.replicas,
        "capacity_tokens": args.capacity_tokens, "speed": speed, "prefill_tps": prefill, "decode_tps": decode,
        "block_size": BLOCK_SIZE, "max_output_tokens": args.max_output_tokens,
        "prompt_tokens_total": sum(len(p) for p in prompts),
        "machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform()},
        "policies": {},
    }
    result.update(ceilings(prompts, args.replicas * args.capacity_tokens))
    log(f"ceilings: infinite {result['ceiling_infinite']:.3f}, lru {result['ceiling_lru']:.3f}")

    extra = {}
    for item in args.routing:
        key, _, value = item.partition("=")
        extra[key.strip()] = yaml.safe_load(value)
    result["routing_options"] = extra
    work = Path(tempfile.mkdtemp(prefix="kvgate-arena-"))
    replicas, urls, events = [], [], []
    try:
        for i in range(args.replicas):
            port = free_port()
            events.append(f"tcp://127.0.0.1:{free_port()}")
            argv = kvgate_argv("sim-replica", "--port", str(port), "--name", f"r{i}",
                               "--capacity-tokens", str(args.capacity_tokens), "--prefill-tps", str(prefill),
                               "--decode-tps", str(decode), "--block-size", str(BLOCK_SIZE), "--events-endpoint", events[-1])
            replicas.append(Proc(f"replica-r{i}", argv, work))
            urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(replicas, urls):
            proc.wait_http(f"{url}/health")
        for policy in policies:
            for u in urls:
                httpx.post(f"{u}/reset", timeout=10)
            port = free_port()
            if policy == "sglang":
                binary = sglang_router_bin()
                if binary is None:
                    result["policies"]["sglang"] = {"skipped": "sglang-router is not installed"}
                    continue
                router = Proc("router-sglang", [binary, "launch", "--host", "127.0.0.1", "--port", str(port),
                                                "--worker-urls", *urls, "--policy", "cache_aware",
                                                "--request-timeout-secs", "600", "--log-level", "warn",
                                                # its metrics listener defaults to :29000, taken by any other router
                                                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())], work)
                ready = f"http://127.0.0.1:{port}/health"
            else:
                cfg_path = work / f"kvgate-{policy}.yaml"
                cfg_path.write_text(yaml.safe_dump(kvgate_config(policy, urls, args.capacity_tokens, str(work / f"cache-{policy}"),
                                                                 events, extra)))
                router = Proc(f"router-{policy}", kvgate_argv("serve", "--config", str(cfg_path), "--port", str(port),
                                                             "--log-level", "warning"), work)
                ready = f"http://127.0.0.1:{port}/health"
            try:
                router.wait_http(ready)
                log(f"{policy}: replaying")
                run = asyncio.run(replay(f"http://127.0.0.1:{port}/v1/chat/completions", trace, prompts, speed,
                                         args.max_output_tokens, {"authorization": "Bearer arena"}))
            finally:
                router.stop()
            summary = summarise(run, replica_stats(urls))
            summary["router"] = "sglang-router --policy cache_aware" if policy == "sglang" else f"kvgate {policy}"
            result["policies"][policy] = summary
            log(f"{policy}: hit {summary['hit_rate']:.3f} ttft p50 {summary['ttft_p50_s']*1000:.0f} ms "
                f"p99 {summary['ttft_p99_s']*1000:.0f} ms imbalance {summary['imbalance']:.2f} errors {summary['errors']}")
    finally:
        for proc in replicas:
            proc.stop()
    ca = result["policies"].get("cache_aware", {})
    sg = result["policies"].get("sglang", {})
    if "hit_rate" in ca:
        result["cache_aware_vs_ceiling_lru"] = ca["hit_rate"] / result["ceiling_lru"] if result["ceiling_lru"] else None
    if "hit_rate" in ca and "hit_rate" in sg:
        result["cache_aware_minus_sglang_hit_rate"] = ca["hit_rate"] - sg["hit_rate"]
        result["cache_aware_p99_over_sglang_p99"] = ca["ttft_p99_s"] / sg["ttft_p99_s"]
    result["logs"] = str(work)
    return result


def main(args: argparse.Namespace) -> int:
    result = run_arena(args)
    print(f"{'policy':14s} {'hit':>6s} {'ttft mean':>10s} {'p50':>8s} {'p99':>8s} {'imbal':>6s} {'errors':>6s}")
    for name, s in result["policies"].items():
        if "hit_rate" in s:
            print(f"{name:14s} {s['hit_rate']:6.3f} {s['ttft_mean_s']*1000:8.0f}ms {s['ttft_p50_s']*1000:6.0f}ms "
                  f"{s['ttft_p99_s']*1000:6.0f}ms {s['imbalance']:6.2f} {s['errors']:6d}")
    print(f"ceiling_infinite {result['ceiling_infinite']:.3f}  ceiling_lru {result['ceiling_lru']:.3f}")
    write_json(args.json, result)
    return 0
