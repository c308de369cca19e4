"""N `kvgate serve` processes for `kvgate bench scaleout`: on one Redis (`store: redis`) or each on
its own cache dir (`store: local`), in front of one fake backend; and the client that sends a
trace round-robin over them, timing each request."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv
from kvgate.tools.bench.scaleout_traffic import Ask, right_answer


def proxy_config(cache_dir: Path, api_base: str, redis_url: str | None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "cache_dir": str(cache_dir),
        "routes": [
            {
                "name": "chat",
                "model": "demo-*",
                "backend": {"model": "openai/served", "api_base": api_base, "api_key": "sk-x", "timeout": 10},
                "semantic": {"threshold": 0.9},
            }
        ],
    }
    if redis_url is not None:
        config["store"] = {"backend": "redis", "url": redis_url, "on_error": "degrade"}
    return config


class Cluster:
    """Started proxies; `stop()` ends them."""

    def __init__(self, n: int, work: Path, api_base: str, redis_url: str | None, tag: str) -> None:
        self.procs: list[Proc] = []
        self.urls: list[str] = []
        for i in range(n):
            cache_dir = work / f"{tag}-cache-{i}"  # local mode: a dir each (separate machines)
            cfg = work / f"{tag}-{i}.yaml"
            cfg.write_text(yaml.safe_dump(proxy_config(cache_dir, api_base, redis_url)))
            port = free_port()
            self.procs.append(
                Proc(f"{tag}-proxy-{i}", kvgate_argv("serve", "--config", str(cfg), "--port", str(port)), work)
            )
            self.urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(self.procs, self.urls):
            proc.wait_http(f"{url}/health", timeout=180)

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()


@dataclass
class Outcome:
    tiers: list[str] = field(default_factory=list)  # per request: miss | exact | semantic | error
    seconds: list[float] = field(default_factory=list)
    wrong: int = 0

    def hit_rate(self, lo: int = 0, hi: int | None = None) -> float:
        part = self.tiers[lo:hi]
        return round(sum(t in ("exact", "semantic") for t in part) / max(1, len(part)), 4)

    def p50_ms(self, tier: str) -> float | None:
        xs = sorted(s for t, s in zip(self.tiers, self.seconds) if t == tier)
        return round(1000 * xs[len(xs) // 2], 3) if xs else None


def send(urls: list[str], asks: list[Ask], pairs: list[tuple[str, str]], on_progress: Any = None) -> Outcome:
    """Each ask in order, one at a time, to urls[i % len(urls)]; every answer checked."""
    out = Outcome()
    clients = [httpx.Client(base_url=u, timeout=30) for u in urls]
    try:
        for i, ask in enumerate(asks):
            if on_progress is not None:
                on_progress(i)
            body = {"model": "demo-1", "messages": [{"role": "user", "content": ask.text}]}
            started = time.perf_counter()
            try:
                resp = clients[i % len(clients)].post(
                    "/v1/chat/completions", json=body, headers={"authorization": "Bearer bench"}
                )
                took = time.perf_counter() - started
                ok = resp.status_code == 200
            except httpx.HTTPError:
                took, ok = time.perf_counter() - started, False
            if not ok:
                out.tiers.append("error")
                out.seconds.append(took)
                continue
            out.tiers.append(resp.headers.get("x-kvgate-cache", "?"))
            out.seconds.append(took)
            out.wrong += not right_answer(resp.json()["choices"][0]["message"]["content"], ask, pairs)
    finally:
        for c in clients:
            c.close()
    return out
