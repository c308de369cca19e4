"""A route whose second replica is down from the start: the proxy's CPU per request and the
requests' latency through `kvgate serve`, with the demo backend as the live replica. `--kind
refuses`: nothing listens on the down replica's port; `drops`: it accepts each connection and
closes it at once (a crashing server, a balancer with nothing behind it). Run from a directory
outside the tree, PYTHONPATH=<tree>:

    python down_replica.py --requests 600 --concurrency 16 --kind refuses --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import socket
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv, sglang_router_bin


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(url: str, n: int, conc: int) -> list[float]:
    lat: list[float] = []
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=conc)) as client:
        todo = iter(range(n))

        async def worker() -> None:
            for i in todo:
                body = {"model": "bench-1", "messages": [{"role": "user", "content": f"question {i} " * 8}]}
                t = time.perf_counter()
                r = await client.post(f"{url}/v1/chat/completions", json=body)
                lat.append(time.perf_counter() - t)
                assert r.status_code == 200, r.text

        await asyncio.gather(*(worker() for _ in range(conc)))
    return lat


def ready(proc: Proc, url: str, timeout: float = 120.0) -> None:
    """Until a chat request goes through (a router registers its workers after it listens)."""
    body = {"model": "bench-1", "messages": [{"role": "user", "content": "ready?"}]}
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
        try:
            if httpx.post(f"{url}/v1/chat/completions", json=body, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{proc.name} never answered:\n{proc.tail()}")


def dropper() -> int:
    """A port that accepts connections and closes each at once (in a thread of its own)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)

    def serve() -> None:
        while True:
            conn, _ = sock.accept()
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return sock.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--down", type=int, default=1, help="replicas that refuse connections (0: none)")
    p.add_argument("--kind", choices=("refuses", "drops"), default="refuses")
    p.add_argument("--target", choices=("kvgate", "sglang_router"), default="kvgate")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvgate-down-"))
    bport, kport = free_port(), free_port()
    backend = Proc("backend", kvgate_argv("demo-backend", "--port", str(bport)), work)
    replicas = [{"name": "r0", "api_base": f"http://127.0.0.1:{bport}/v1"}]
    ports = [free_port() if a.kind == "refuses" else dropper() for _ in range(a.down)]
    replicas += [{"name": f"down{k}", "api_base": f"http://127.0.0.1:{port}/v1"} for k, port in enumerate(ports)]
    config = {
        "cache_dir": str(work / "cache"),
        "routes": [
            {
                "name": "bench",
                "model": "bench-*",
                "scope": "shared",
                "exact": False,
                "semantic": {"enabled": False},
                "backend": {"model": "openai/fake", "api_key": "none", "timeout": 60},
                "replicas": replicas,
                "routing": {"policy": "cache_aware", "prefix": {"tokenizer": "text"}, "forward": "relay"},
            }
        ],
    }
    (work / "kvgate.yaml").write_text(yaml.safe_dump(config))
    if a.target == "kvgate":
        argv = kvgate_argv("serve", "--config", str(work / "kvgate.yaml"), "--port", str(kport))
    else:  # its own health checks and start-up timeout shortened to what a down worker needs
        urls = [r["api_base"].removesuffix("/v1") for r in replicas]
        argv = [str(sglang_router_bin()), "launch", "--host", "127.0.0.1", "--port", str(kport)]
        argv += ["--worker-urls", *urls, "--policy", "cache_aware", "--log-level", "warn"]
        argv += ["--worker-startup-timeout-secs", "5", "--prometheus-port", str(free_port())]
    proxy = Proc(a.target, argv, work)
    try:
        backend.wait_http(f"http://127.0.0.1:{bport}/v1/models")
        url = f"http://127.0.0.1:{kport}"
        ready(proxy, url)
        asyncio.run(load(url, 50, a.concurrency))  # warm: pools open, the first discovery done
        c0, t0 = cpu_s(proxy.proc.pid), time.perf_counter()
        lat = asyncio.run(load(url, a.requests, a.concurrency))
        c1, t1 = cpu_s(proxy.proc.pid), time.perf_counter()
    finally:
        proxy.stop()
        backend.stop()
    lat.sort()
    out = {
        "requests": a.requests,
        "concurrency": a.concurrency,
        "down_replicas": a.down,
        "kind": a.kind,
        "target": a.target,
        "proxy_cpu_ms_per_request": round((c1 - c0) / a.requests * 1e3, 3),
        "req_per_s": round(a.requests / (t1 - t0), 1),
        "p50_ms": round(statistics.median(lat) * 1e3, 2),
        "p99_ms": round(lat[int(0.99 * (len(lat) - 1))] * 1e3, 2),
    }
    print(json.dumps(out))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
