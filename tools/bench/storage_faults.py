"""`kvgate bench storage-faults`: SIGKILL the proxy and a disk-tier writer during heavy writes, N
times; fill the disk under both.

kill   Each round starts `kvgate serve` (exact + semantic tiers, cache dir kept across rounds) in
       front of an in-process fake backend that answers "Answer: <question>", and a chunk writer
       process (kvgate.tools.bench.chunk_writer: opens the shared KV disk tier, verifies every stored
       chunk against the data it must hold, then writes 1 MiB chunks under a 32 MiB budget). A
       client sends `--concurrency` requests at a time, drawn from a pool of questions (repeats are
       hits, new ones are writes), and checks every answer: a miss or exact hit must be its own
       question's answer, a semantic hit some pool question's answer, never anything else. After a
       random 0.5-1.5 s both processes get SIGKILL together. The next round must start them again
       on the same directories. After the last round a final proxy re-asks every question that was
       answered, and a final writer verifies the disk tier.
       Reported: rounds, requests answered and checked, wrong answers served (goal 0), requests cut
       by the kill (in flight when it landed: the client sees a dropped connection, nothing is
       stored), chunks verified on each restart, chunks the codec rejected, wrong chunks (goal 0).
full   A 4 MiB tmpfs (`mount -t tmpfs -o size=4m`, needs root; reported as skipped otherwise) holds
       the proxy's cache dir; a ballast file fills it while requests go on; then the ballast is
       removed. Reported: requests and errors (goal 0), stores that failed softly, warnings logged
       for them (goal 1 per streak), whether stores resumed; and the same for a chunk DiskTier.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
import yaml

from kvgate.engines.demo import create_fake_app
from kvgate.tools.bench.procs import Proc, ServerThread, free_port, kvgate_argv
from kvgate.tools.bench.replica_faults import parse_metrics
from kvgate.tools.bench.stats import write_json

log = logging.getLogger("kvgate.bench.storage")
POOL = 3000


def question(j: int) -> str:
    return f"[[fixed]] Question {j}: what do record {j * 7919 % 100_003} and record {j} have in common?"


def proxy_config(cache_dir: Path, api_base: str, semantic: bool = True) -> dict[str, Any]:
    return {
        "cache_dir": str(cache_dir),
        "routes": [
            {
                "name": "chat",
                "model": "demo-*",
                "backend": {"model": "openai/served", "api_base": api_base, "api_key": "sk-x", "timeout": 10},
                "semantic": {"threshold": 0.95, "enabled": semantic},
            }
        ],
    }


def start_proxy(work: Path, config: dict[str, Any], tag: str) -> tuple[Proc, str]:
    cfg = work / "proxy.yaml"
    cfg.write_text(yaml.safe_dump(config))
    port = free_port()
    proc = Proc(f"proxy-{tag}", kvgate_argv("serve", "--config", str(cfg), "--port", str(port)), work)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(f"{url}/health", timeout=120)
    # one warm-up request (first-call imports), so a round's load window is spent serving
    httpx.post(
        f"{url}/v1/chat/completions",
        timeout=60,
        json={"model": "demo-1", "messages": [{"role": "user", "content": "[[fixed]] warm-up"}]},
    )
    return proc, url


def check_answer(j: int, resp: httpx.Response) -> str | None:
    """None when the response is a correct answer to question j (see module docstring)."""
    if resp.status_code != 200:
        return f"HTTP {resp.status_code}"
    text = resp.json()["choices"][0]["message"]["content"]
    if text == f"Answer: {question(j)}":
        return None
    if resp.headers.get("x-kvgate-cache") == "semantic" and text.startswith("Answer: [[fixed]] Question "):
        k = text.split("Question ", 1)[1].split(":", 1)[0]
        if k.isdigit() and text == f"Answer: {question(int(k))}":
            return None  # another question's intact answer, found by meaning
    return f"wrong answer ({resp.headers.get('x-kvgate-cache')}): {text[:80]!r}"


async def _load(
    url: str, concurrency: int, stop: asyncio.Event, rng: random.Random, seen: set[int], totals: dict[str, Any]
) -> None:
    async def worker(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            j = rng.randrange(POOL)
            body = {"model": "demo-1", "messages": [{"role": "user", "content": question(j)}]}
            try:
                resp = await client.post("/v1/chat/completions", json=body)
            except httpx.HTTPError:
                totals["cut_by_kill"] += 1  # in flight when the proxy died: nothing was answered
                return
            problem = check_answer(j, resp)
            totals["answered"] += 1
            if problem:
                totals["wrong"] += 1
                totals["wrong_samples"] = (totals["wrong_samples"] + [problem])[:5]
            else:
                seen.add(j)
                totals["hits"] += resp.headers.get("x-kvgate-cache") != "miss"

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))


def _writer(work: Path, kv_dir: Path, seed: int, verify_only: bool = False) -> tuple[subprocess.Popen, dict[str, int]]:
    argv = kvgate_argv()[:2] + ["kvgate.tools.bench.chunk_writer", "--dir", str(kv_dir), "--seed", str(seed)]
    if verify_only:
        argv.append("--verify-only")
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=open(work / f"writer-{seed}.log", "w"), text=True, start_new_session=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        raise RuntimeError(f"chunk writer exited with {proc.returncode}; see {work / f'writer-{seed}.log'}")
    report = json.loads(line)
    if not verify_only and proc.stdout.readline().strip() != "writing":
        raise RuntimeError("chunk writer did not start writing")
    return proc, report


def kill_loop(
    work: Path, rounds: int = 20, concurrency: int = 8, seed: int = 0, semantic: bool = True
) -> dict[str, Any]:
    rng = random.Random(seed)
    backend = ServerThread(create_fake_app()).start()
    config = proxy_config(work / "cache", f"{backend.url}/v1", semantic)
    kv_dir = work / "kv"
    totals: dict[str, Any] = {"answered": 0, "hits": 0, "wrong": 0, "wrong_samples": [], "cut_by_kill": 0}
    chunks = {"verified": 0, "corrupt_detected": 0, "wrong": 0}
    seen: set[int] = set()
    restarts = 0
    try:
        for r in range(rounds):
            proxy, url = start_proxy(work, config, f"round{r}")
            writer, report = _writer(work, kv_dir, seed=r + 1)
            restarts += r > 0
            for k in chunks:
                chunks[k] += report[k]

            async def round_() -> None:
                stop = asyncio.Event()
                task = asyncio.create_task(_load(url, concurrency, stop, rng, seen, totals))
                await asyncio.sleep(rng.uniform(1.0, 2.5))
                for pid in (proxy.proc.pid, writer.pid):  # both at once, mid-write
                    os.killpg(pid, signal.SIGKILL)
                stop.set()
                await task

            try:
                asyncio.run(round_())
            finally:
                for p in (proxy.proc, writer):
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                proxy.stop()
        # the final check: every question answered so far, once more, from the cache left behind
        proxy, url = start_proxy(work, config, "final")
        try:
            final = {"answered": 0, "wrong": 0, "hits": 0}
            with httpx.Client(base_url=url, timeout=30) as client:
                for j in sorted(seen):
                    resp = client.post(
                        "/v1/chat/completions",
                        json={"model": "demo-1", "messages": [{"role": "user", "content": question(j)}]},
                    )
                    final["answered"] += 1
                    final["wrong"] += check_answer(j, resp) is not None
                    final["hits"] += resp.headers.get("x-kvgate-cache") != "miss"
        finally:
            proxy.stop()
        _, report = _writer(work, kv_dir, seed=0, verify_only=True)
        for k in chunks:
            chunks[k] += report[k]
    finally:
        backend.stop()
    return {
        "experiment": "kill",
        "rounds": rounds,
        "semantic": semantic,
        "restarts_after_kill": restarts + 1,
        "load": totals,
        "final_reask": final,
        "chunks": chunks,
    }


def _tmpfs(path: Path, size_mb: int) -> str | None:
    """Mount a tmpfs of size_mb at path; None on success, else why not."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], capture_output=True, text=True
    )
    return None if done.returncode == 0 else (done.stderr.strip() or f"mount exited {done.returncode}")


def _fill(path: Path, leave: int) -> Path:
    """A ballast file that leaves about `leave` bytes free on path's filesystem."""
    st = os.statvfs(path)
    ballast = path / "ballast"
    with open(ballast, "wb") as f:
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return ballast


def disk_full(work: Path, size_mb: int = 4, requests: int = 120) -> dict[str, Any]:
    mnt = work / "small"
    why = _tmpfs(mnt, size_mb)
    if why is not None:
        return {"experiment": "full", "skipped": f"cannot mount a {size_mb} MiB tmpfs: {why}"}
    backend = ServerThread(create_fake_app()).start()
    result: dict[str, Any] = {"experiment": "full", "tmpfs_mb": size_mb}
    try:
        # exact tier only: padded questions would be found by meaning, which is beside the point here
        proxy, url = start_proxy(work, proxy_config(mnt / "cache", f"{backend.url}/v1", semantic=False), "full")
        try:
            ballast = _fill(mnt, leave=256 << 10)
            errors, wrong = 0, 0
            with httpx.Client(base_url=url, timeout=30) as client:

                def ask(j: int, pad: int) -> None:
                    nonlocal errors, wrong
                    q = question(j) + " " + "context " * pad
                    resp = client.post(
                        "/v1/chat/completions", json={"model": "demo-1", "messages": [{"role": "user", "content": q}]}
                    )
                    if resp.status_code != 200:
                        errors += 1
                    elif resp.json()["choices"][0]["message"]["content"] != f"Answer: {q}":
                        wrong += 1

                for j in range(requests):  # answers of ~1 KB, ~8 KB and ~40 KB (value files): the disk fills
                    ask(j, (100, 1000, 5000)[j % 3])
                full_metrics = parse_metrics(client.get("/metrics").text)
                ballast.unlink()
                for j in range(requests, requests + 20):
                    ask(j, 100)
                after = parse_metrics(client.get("/metrics").text)
        finally:
            proxy.stop()
        text = proxy.log_path.read_text(errors="replace")
        stored = 'kvgate_cache_stores_total{result="stored",route="chat"}'
        failed = 'kvgate_cache_stores_total{result="failed",route="chat"}'
        result["proxy"] = {
            "requests": requests + 20,
            "errors": errors,
            "wrong": wrong,
            "stores_failed_softly": int(after.get(failed, 0)),
            "stored_while_full": int(full_metrics.get(stored, 0)),
            "stored_after_space_freed": int(after.get(stored, 0) - full_metrics.get(stored, 0)),
            "warnings_logged": text.count("further failures are counted"),
            "recovery_logged": "store works again" in text,
            "recoveries_logged": text.count("works again"),  # a store that flaps warns once per episode
        }
        result["chunks"] = _chunks_on_full_disk(mnt)
    finally:
        backend.stop()
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    return result


def _chunks_on_full_disk(mnt: Path) -> dict[str, Any]:
    """A ChunkStore whose disk tier sits on the (re-filled) tmpfs: puts fail softly, get still works."""
    from kvgate.index.kv.chunks import ChunkStore, DiskTier, MemoryTier
    from kvgate.tools.bench.chunk_writer import NAMESPACE, det_chunk, same

    records: list[logging.LogRecord] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Catch(logging.WARNING)
    logging.getLogger("kvgate").addHandler(handler)
    try:
        store = ChunkStore([MemoryTier(64 << 20), DiskTier(mnt / "kv", 64 << 20)], NAMESPACE)
        ballast = _fill(mnt, leave=256 << 10)
        hashes = list(range(1, 11))
        store.put_many(hashes, [det_chunk(h) for h in hashes])  # 10 MiB into 256 KiB: must not raise
        got = store.get_many(hashes)  # still served, from RAM
        disk = store.tiers[1].stats()
        ballast.unlink()
        store.close()
    finally:
        logging.getLogger("kvgate").removeHandler(handler)
    return {
        "puts": len(hashes),
        "disk_write_errors": disk["write_errors"],
        "served_from_ram": len(got),
        "served_correct": sum(same(c, det_chunk(h)) for c, h in zip(got, hashes)),
        "warnings_logged": sum("disk tier" in r.getMessage() for r in records),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experiments", default="kill,full", help="comma list of kill, full")
    p.add_argument("--rounds", type=int, default=20, help="kill: SIGKILL rounds")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exact-only", action="store_true", help="kill: semantic tier off (faster proxy start)")
    p.add_argument("--json", type=Path, default=None)


def main(args: argparse.Namespace) -> int:
    results = []
    for name in args.experiments.split(","):
        with tempfile.TemporaryDirectory(prefix=f"kvgate-storage-{name}-") as work:
            if name == "kill":
                result = kill_loop(Path(work), args.rounds, args.concurrency, args.seed, not args.exact_only)
            else:
                result = disk_full(Path(work))
        print(json.dumps(result), flush=True)
        results.append(result)
    write_json(args.json, {"experiments": results})
    return 0
