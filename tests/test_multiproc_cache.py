"""Three `kvgate serve` processes on one cache_dir: answers stored by one are served by the
others (exact at once, semantic after the follower's catch-up), and after a concurrent mixed load
the directory holds no unreadable entry, no dangling exact pointer, and every process counts the
same entries as the disk."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import yaml

from kvgate.index.responses.semantic import SemanticIndex
from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv
from kvgate.tools.bench.soak import Workload, drive, vocabulary

KEY = "multi-tenant-key"


def test_three_proxies_share_one_cache_dir(tmp_path: Path) -> None:
    backend_port, ports = free_port(), [free_port() for _ in range(3)]
    config = {
        "cache_dir": str(tmp_path / "cache"),
        "auth": {"keys": [KEY, "other-key"]},
        "routes": [
            {
                "name": "chat",
                "model": "demo-*",
                "backend": {"model": "openai/fake", "api_base": f"http://127.0.0.1:{backend_port}/v1", "api_key": "x"},
                "semantic": {"threshold": 0.9},
            }
        ],
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    procs = [Proc("backend", kvgate_argv("demo-backend", "--port", str(backend_port)), tmp_path)]
    procs += [
        Proc(f"proxy{i}", kvgate_argv("serve", "--config", str(tmp_path / "config.yaml"), "--port", str(p)), tmp_path)
        for i, p in enumerate(ports)
    ]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    auth = {"authorization": f"Bearer {KEY}"}
    try:
        procs[0].wait_http(f"http://127.0.0.1:{backend_port}/v1/models")
        for proc, url in zip(procs[1:], urls):
            proc.wait_http(f"{url}/health")

        def chat(url: str, text: str, **headers: str) -> httpx.Response:
            body = {"model": "demo-1", "messages": [{"role": "user", "content": text}]}
            resp = httpx.post(f"{url}/v1/chat/completions", json=body, headers={**auth, **headers}, timeout=30)
            assert resp.status_code == 200, resp.text
            return resp

        question = "How many moons does the planet Mars have?"
        first = chat(urls[0], question)
        assert first.headers["x-kvgate-cache"] == "miss"
        for url in urls[1:]:  # the exact tier reads the shared disk: visible at once
            again = chat(url, question)
            assert again.headers["x-kvgate-cache"] == "exact"
            assert again.json()["choices"] == first.json()["choices"]
        # the semantic tier: each process's vectors catch up with the disk within follow_interval_s (1 s)
        paraphrase = "How many moons does Mars have?"
        for url in urls[1:]:
            deadline, tier = time.time() + 10, "miss"
            while tier != "semantic" and time.time() < deadline:
                tier = chat(url, paraphrase, **{"x-kvgate-cache-control": "no-store"}).headers["x-kvgate-cache"]
                time.sleep(0.3)
            assert tier == "semantic", url

        work = Workload(seed=3, tenants=[KEY, "other-key"], words=vocabulary())
        load = asyncio.run(drive(urls, work, 450, 24, "demo-1"))
        counts = load["counts"]
        assert counts.get("errors", 0) == 0 and counts.get("wrong_answers", 0) == 0, load["problems"]
        assert counts["served_exact"] and counts["served_semantic"] and counts["served_miss"]

        time.sleep(1.2)  # one follower interval: every process has read the others' writes
        counted = [httpx.get(f"{url}/health", timeout=10).json()["entries"] for url in urls]
        for proc in procs:
            assert proc.proc.poll() is None, proc.tail()
    finally:
        for proc in procs:
            proc.stop()

    # read back through the cache's own storage format (sealed values): opening drops what it
    # cannot read, so equal counts before and after mean nothing was damaged
    index = SemanticIndex(tmp_path / "cache" / "responses", 384, follow_interval_s=None)
    keys = [k for k in index.entries.cache.iterkeys() if isinstance(k, str)]
    on_disk = {int(k[2:]) for k in keys if k.startswith("e:")}
    pointers = [index.entries.cache.get(k) for k in keys if k.startswith("x:")]
    try:
        assert len(index) == len(on_disk), "unreadable entries were dropped on open"
        for entry_id in on_disk:
            entry = index.get(entry_id)
            assert entry is not None and entry.id == entry_id and entry.response["choices"]
        assert all(p is not None and int(p) in on_disk for p in pointers)  # no dangling exact pointer
    finally:
        index.close()
    assert counted == [len(on_disk)] * 3, (counted, len(on_disk))
    assert len(on_disk) >= counts["served_miss"] // 2
