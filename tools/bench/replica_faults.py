"""`kvgate bench replica-faults`: kill, slow down or hang one of N replicas under load through the proxy.

Processes, all on 127.0.0.1: N `kvgate sim-replica` (started with one shared `--name`, so every
replica answers a request with the same text, as greedy replicas of one model do) and one
`kvgate serve` whose only route spreads misses over them (exact tier on, semantic tier off, every
prompt distinct, so every request reaches a replica). A client runs `--requests` requests,
`--concurrency` at a time, every other one streamed, all greedy (`temperature: 0`), and checks
each answer word for word: a non-streamed body must be the expected text, a stream must
reassemble to it with no in-band error and end with `[DONE]`.

Scenarios
    kill  SIGKILL replica r1 once `--kill-at` of the requests have completed (streams to it die
          mid-way), restart it on the same port once `--restart-at` have completed, and keep the
          load going until it served traffic again (at most 3x the requests). Reports errors,
          failovers before the first byte and mid-stream (from the proxy's /metrics), whether its
          circuit was seen open (kvgate_replica_up 0) and how many requests it served after the
          restart.
    slow  r1's prefill costs `--slow-ms` per request (a slow replica): reports its share.
    hang  r1's prefill costs 60 s, far beyond `backend.timeout` (`--timeout`): every request sent
          there times out and moves on; reports errors, failovers and the share it answered.
    down  r1 is never started (its port refuses connections) for the whole run: it cannot say
          what engine it runs, so this is also what the requests pay while a replica stays
          undescribed.
The steady scenarios (slow, hang, down) also report the proxy's CPU per request. Timings are
reported (p50/p99 latency per request), never judged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from kvgate.engines.sim.server import answer_words
from kvgate.tools.bench.procs import group_cpu_s
from kvgate.tools.bench.replica_faults_cluster import SIM_NAME, Cluster
from kvgate.tools.bench.stats import pct, write_json

VICTIM = 1  # the replica that is killed / slowed / hung


@dataclass
class Outcome:
    index: int
    stream: bool
    ok: bool
    replica: str | None
    seconds: float
    finished: float
    error: str | None = None


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {'name{labels}': value} (enough for our own counters)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                continue
    return out


def expected_text(max_tokens: int) -> str:
    return " ".join(answer_words(SIM_NAME, max_tokens))


async def one_request(client: httpx.AsyncClient, i: int, stream: bool, max_tokens: int) -> Outcome:
    body = {
        "model": "sim-1",
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": f"Request {i}: tell me about item {i * 7919 % 10007}."}],
    }
    started = time.perf_counter()
    error, replica = None, None
    try:
        if not stream:
            resp = await client.post("/v1/chat/completions", json=body)
            replica = resp.headers.get("x-kvgate-replica")
            if resp.status_code != 200:
                error = f"HTTP {resp.status_code}: {resp.text[:200]}"
            elif resp.json()["choices"][0]["message"]["content"] != expected_text(max_tokens):
                error = f"wrong answer: {resp.json()['choices'][0]['message']['content'][:200]!r}"
        else:
            async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
                replica = resp.headers.get("x-kvgate-replica")
                if resp.status_code != 200:
                    error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                else:
                    error = check_sse([line async for line in resp.aiter_lines()], expected_text(max_tokens))
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return Outcome(i, stream, error is None, replica, time.perf_counter() - started, time.monotonic(), error)


def check_sse(lines: list[str], expected: str) -> str | None:
    """None when the SSE lines are a complete, error-free stream of `expected`; else why not."""
    data = [line[6:] for line in lines if line.startswith("data: ")]
    if not data or data[-1] != "[DONE]":
        return "stream did not end with [DONE]"
    text = ""
    for raw in data[:-1]:
        event = json.loads(raw)
        if "error" in event:
            return f"in-band error: {event['error'].get('message', '')[:200]}"
        for choice in event.get("choices") or []:
            text += (choice.get("delta") or {}).get("content") or ""
    return None if text == expected else f"wrong streamed answer: {text[:200]!r}"


class Load:
    """Keeps `concurrency` requests in flight while fewer than `limit` were issued; with `hold`,
    idle workers wait for the limit to rise instead of returning."""

    def __init__(self, url: str, concurrency: int, max_tokens: int, limit: int, hold: bool = False) -> None:
        self.url, self.concurrency, self.max_tokens = url, concurrency, max_tokens
        self.outcomes: list[Outcome] = []
        self.issued = 0
        self.limit = limit
        self.hold = hold

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        async with httpx.AsyncClient(base_url=self.url, timeout=120, limits=limits) as client:
            await asyncio.gather(*(self._worker(client) for _ in range(self.concurrency)))

    async def _worker(self, client: httpx.AsyncClient) -> None:
        while self.issued < self.limit or self.hold:
            if self.issued >= self.limit:
                await asyncio.sleep(0.01)
                continue
            i = self.issued
            self.issued += 1
            self.outcomes.append(await one_request(client, i, stream=i % 2 == 1, max_tokens=self.max_tokens))


async def _metrics(client: httpx.AsyncClient) -> dict[str, float]:
    return parse_metrics((await client.get("/metrics")).text)


def _up(metrics: dict[str, float], replica: str) -> float | None:
    return metrics.get(f'kvgate_replica_up{{replica="{replica}",route="sim"}}')


def _failovers(metrics: dict[str, float], when: str) -> int:
    return int(metrics.get(f'kvgate_backend_failovers_total{{route="sim",when="{when}"}}', 0))


def summarize(outcomes: list[Outcome], seconds: float) -> dict[str, Any]:
    errors = [o for o in outcomes if not o.ok]
    lat = [o.seconds for o in outcomes]
    return {
        "requests": len(outcomes),
        "streamed": sum(o.stream for o in outcomes),
        "errors": len(errors),
        "error_samples": [e.error for e in errors[:5]],
        "served_by": dict(sorted(Counter(o.replica or "-" for o in outcomes).items())),
        "latency_p50_ms": round(pct(lat, 0.5) * 1000, 1),
        "latency_p99_ms": round(pct(lat, 0.99) * 1000, 1),
        "seconds": round(seconds, 2),
    }


async def kill_scenario(
    cluster: Cluster, requests: int, concurrency: int, max_tokens: int, kill_at: float, restart_at: float
) -> dict[str, Any]:
    victim = f"r{VICTIM}"
    cap = 3 * requests  # the run is bounded even if the replica never comes back
    load = Load(cluster.url, concurrency, max_tokens, limit=requests, hold=True)
    seen_down = False
    restarted_at: float | None = None

    def keep_going() -> None:  # load flows on while we wait for something to happen
        load.limit = min(cap, max(load.limit, load.issued + concurrency))

    async def chaos() -> None:
        nonlocal seen_down, restarted_at
        try:
            async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
                while len(load.outcomes) < kill_at * requests:
                    await asyncio.sleep(0.01)
                cluster.kill(VICTIM)
                while (len(load.outcomes) < restart_at * requests or not seen_down) and load.issued < cap:
                    seen_down = seen_down or _up(await _metrics(client), victim) == 0.0
                    keep_going()
                    await asyncio.sleep(0.05)
                restart = asyncio.create_task(asyncio.to_thread(cluster.restart, VICTIM))
                while not restart.done():
                    keep_going()
                    await asyncio.sleep(0.05)
                await restart
                restarted_at = time.monotonic()
                while load.issued < cap:
                    back = sum(1 for o in load.outcomes if o.replica == victim and o.finished > restarted_at)
                    if back >= 5 and load.issued >= requests:
                        break
                    keep_going()
                    await asyncio.sleep(0.05)
        finally:
            load.limit, load.hold = min(load.limit, load.issued), False

    started = time.perf_counter()
    await asyncio.gather(load.run(), chaos())
    seconds = time.perf_counter() - started
    async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
        metrics = await _metrics(client)
    result = summarize(load.outcomes, seconds)
    result.update(
        {
            "scenario": "kill",
            "victim": victim,
            "circuit_opened": seen_down,
            "failovers_before_first_byte": _failovers(metrics, "before_first_byte"),
            "failovers_mid_stream": _failovers(metrics, "mid_stream"),
            "victim_requests_after_restart": sum(
                1
                for o in load.outcomes
                if o.replica == victim and restarted_at is not None and o.finished > restarted_at
            ),
        }
    )
    return result


async def steady_scenario(
    cluster: Cluster, name: str, requests: int, concurrency: int, max_tokens: int
) -> dict[str, Any]:
    load = Load(cluster.url, concurrency, max_tokens, limit=requests)
    started, cpu = time.perf_counter(), group_cpu_s(cluster.proxy_pgid)
    await load.run()
    seconds = time.perf_counter() - started
    cpu = group_cpu_s(cluster.proxy_pgid) - cpu
    async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
        metrics = await _metrics(client)
    result = summarize(load.outcomes, seconds)
    victim = f"r{VICTIM}"
    result.update(
        {
            "scenario": name,
            "victim": victim,
            "victim_share": round(result["served_by"].get(victim, 0) / max(1, len(load.outcomes)), 4),
            "proxy_cpu_ms_per_request": round(cpu / max(1, len(load.outcomes)) * 1e3, 3),
            "failovers_before_first_byte": _failovers(metrics, "before_first_byte"),
            "failovers_mid_stream": _failovers(metrics, "mid_stream"),
        }
    )
    return result


def run_scenario(
    scenario: str,
    *,
    work: Path,
    replicas: int = 4,
    requests: int = 400,
    concurrency: int = 16,
    max_tokens: int = 24,
    kill_at: float = 0.25,
    restart_at: float = 0.5,
    slow_ms: float = 300.0,
    timeout_s: float = 1.0,
    policy: str = "cache_aware",
    decode_tps: float = 60.0,
) -> dict[str, Any]:
    """Start a fresh cluster in `work`, run one scenario, stop everything, return its figures."""
    overhead = {"slow": {VICTIM: slow_ms}, "hang": {VICTIM: 60_000.0}}.get(scenario, {})
    timeout = timeout_s if scenario == "hang" else 10.0
    absent = frozenset({VICTIM}) if scenario == "down" else frozenset()
    cluster = Cluster(work, replicas, overhead, timeout, policy, decode_tps, absent)
    try:
        cluster.start()
        if scenario == "kill":
            result = asyncio.run(kill_scenario(cluster, requests, concurrency, max_tokens, kill_at, restart_at))
        else:
            result = asyncio.run(steady_scenario(cluster, scenario, requests, concurrency, max_tokens))
    finally:
        cluster.stop()
    result.update(
        {
            "replicas": replicas,
            "concurrency": concurrency,
            "policy": policy,
            "backend_timeout_s": timeout,
            "decode_tps": decode_tps,
            "max_tokens": max_tokens,
        }
    )
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scenarios",
        default="kill,slow,hang,down",
        help="comma list of kill, slow, hang, down (one replica never started: nothing listens on its port)",
    )
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--kill-at", type=float, default=0.25, help="kill: fraction of requests completed before SIGKILL")
    p.add_argument("--restart-at", type=float, default=0.5, help="kill: fraction completed before the restart")
    p.add_argument("--slow-ms", type=float, default=300.0, help="slow: the slow replica's per-request prefill cost")
    p.add_argument("--timeout", type=float, default=1.0, help="hang: backend.timeout in seconds")
    p.add_argument("--policy", default="cache_aware")
    p.add_argument(
        "--decode-tps", type=float, default=60.0, help="replica decode rate: max_tokens/decode_tps is a stream's length"
    )
    p.add_argument("--json", type=Path, default=None)


def main(args: argparse.Namespace) -> int:
    results = []
    for scenario in args.scenarios.split(","):
        with tempfile.TemporaryDirectory(prefix=f"kvgate-faults-{scenario}-") as work:
            result = run_scenario(
                scenario,
                work=Path(work),
                replicas=args.replicas,
                requests=args.requests,
                concurrency=args.concurrency,
                max_tokens=args.max_tokens,
                kill_at=args.kill_at,
                restart_at=args.restart_at,
                slow_ms=args.slow_ms,
                timeout_s=args.timeout,
                policy=args.policy,
                decode_tps=args.decode_tps,
            )
        print(json.dumps(result), flush=True)
        results.append(result)
    write_json(args.json, {"scenarios": results})
    return 0 if all(r["errors"] == 0 for r in results) else 1
