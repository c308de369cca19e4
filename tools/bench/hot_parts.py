"""Micro timings of pieces of a relayed miss's path, each in one process, CPU time per call
(median of several rounds): the SSE parser over an 18-event stream (one event per read, and all
in one read) and over a 32,768-event one, a two-message request view,
a group commit's request records, an answer's entry with its pointer and tenant row, a 40-block
prefix record, and an approximate-mode router's hashing, match and records of one all-miss
request of the throughput bench (per call, over a batch of new requests a step at a time). For comparing two trees of the code on the same machine (run it under each with
PYTHONPATH, alternately), where the end-to-end bench's spread hides a few percent.

    python -m kvgate.tools.bench.hot_parts [--rounds N] [--scale F] [--gets PAGE]

`--gets PAGE`: also the proxy's background GET of a replica's /metrics page (the file PAGE, served
by a server in a child process, so only the client's CPU is counted) and of /v1/models, through
httpx's client and through the pooled client the proxy uses (`PooledGets`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import orjson

from kvgate.index.kv.prefix import PrefixIndex
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import load_tokenizer
from kvgate.index.responses.entries.base import CacheEntry
from kvgate.index.responses.entries.disk import DiskEntryStore
from kvgate.middleware.cache.request_log import DiskRequestLog, RequestRecord, new_request_id
from kvgate.middleware.config import parse_config
from kvgate.middleware.forward.relay_events import SseParser
from kvgate.middleware.request import CacheControl, build_view
from kvgate.tools.bench.throughput import Workload

WORDS = [f"w{i} " for i in range(16)]
CAPACITY = 262144  # the prefix index's default per replica


def median_us(fn: Callable[[], Any], calls: int, rounds: int) -> float:
    """CPU µs per call of `fn`, the median of `rounds` rounds of `calls` calls."""
    out = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(calls):
            fn()
        out.append((time.process_time() - started) / calls * 1e6)
    return sorted(out)[len(out) // 2]


def _events(words: list[str] = WORDS) -> list[bytes]:
    head = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [
        {**head, "choices": [{"index": 0, "delta": {"content": w, **({"role": "assistant"} if i == 0 else {})}}]}
        for i, w in enumerate(words)
    ]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks.append({**head, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21}})
    return [b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks]


def measure(rounds: int = 7, scale: float = 1.0) -> dict[str, float]:
    """Each piece's CPU µs per call (per record / entry where they come in batches of 8)."""

    def n(calls: int) -> int:
        return max(1, int(calls * scale))

    out: dict[str, float] = {}
    events = _events()

    def read(reads: list[bytes]) -> Callable[[], None]:
        """A stream's answer from these reads of the replica's bytes."""

        def stream() -> None:
            parser = SseParser(True)
            for data in reads:
                parser.feed(data)
            parser.answer([])

        return stream

    out["sse_stream_18_events_us"] = median_us(read(events), n(2000), rounds)
    # a fast replica: the whole stream in one read
    out["sse_stream_18_events_one_read_us"] = median_us(read([b"".join(events)]), n(2000), rounds)
    # a long answer, one event per read as an engine sends it
    long_stream = read(_events(WORDS * 2048))
    out["sse_stream_32k_events_ms"] = median_us(long_stream, n(3), rounds) / 1000
    config = parse_config(
        {"routes": [{"name": "bench", "model": "bench-*", "scope": "shared", "semantic": {"enabled": False}}]}
    )
    kwargs = {
        "model": "bench-1",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. " * 4},
            {"role": "user", "content": " ".join(f"word{i}" for i in range(16))},
        ],
        "stream": True,
    }
    out["build_view_us"] = median_us(lambda: build_view(config, kwargs, "t", CacheControl()), n(5000), rounds)
    with tempfile.TemporaryDirectory() as logs, tempfile.TemporaryDirectory() as entries:
        log = DiskRequestLog(logs, ttl=3600, max_bytes=10**8)
        record = RequestRecord("tenant-hash", "bench", "miss", "scope" * 8, 17)

        def records() -> None:
            with log.batch():
                for _ in range(8):
                    log.record(new_request_id(), record)

        out["request_log_per_record_us"] = median_us(records, n(200), rounds) / 8
        log.close()
        store = DiskEntryStore(entries, 384)
        answer = {
            "id": "x",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "".join(WORDS)}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21},
        }
        ids = iter(range(1, 10**9))

        def puts() -> None:
            with store.batch():
                for _ in range(8):
                    i = next(ids)
                    store.put(CacheEntry(i, "s" * 64, answer, exact_key=f"{i:064x}", tenant="t"), None, None)

        out["entry_put_per_entry_us"] = median_us(puts, n(100), rounds) / 8
        store.close()
    index = PrefixIndex()
    index.add_replica("r0", CAPACITY)
    rng = random.Random(1)
    chains = [[rng.getrandbits(64) for _ in range(40)] for _ in range(4096)]
    turn = iter(range(10**9))
    out["prefix_record_40_blocks_us"] = median_us(
        lambda: index.record("r0", chains[next(turn) % len(chains)]), n(5000), rounds
    )
    out.update(_routing_parts(n(3000), rounds))
    return {k: round(v, 2) for k, v in out.items()}


def _routing_parts(calls: int, rounds: int) -> dict[str, float]:
    """An approximate-mode router's own work on the throughput bench's all-miss requests (a
    400-word system prompt out of 8, a new question; `text` blocks of 64 characters): the plan's
    hashing, the match, the prompt's record, the prompt + answer's hashing and its record."""
    args = argparse.Namespace(question_words=16, stream_share=0.5, system_words=400, seed=0)
    work = Workload("parts", args, 1)
    hasher = PromptHasher(load_tokenizer("text"), 64)
    index = PrefixIndex()
    index.add_replica("r0", CAPACITY)
    prompts = [orjson.loads(work.body(work.new()))["messages"] for _ in range(calls * (rounds + 1))]
    for messages in prompts[:calls]:  # the system prompts' chains, as a running router has them
        index.record("r0", hasher.prompt(messages).hashes)
    answer = {"role": "assistant", "content": "An answer of a few words, as the demo backend gives."}
    laps: dict[str, list[float]] = {}

    def lap(name: str, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        started = time.process_time()
        out = [fn(item) for item in items]
        laps.setdefault(name, []).append((time.process_time() - started) / len(items))
        return out

    for r in range(1, rounds + 1):  # each round a batch of new requests, one step at a time
        batch = prompts[calls * r : calls * (r + 1)]
        plans = lap("router_prompt_hash_us", hasher.prompt, batch)
        lap("router_match_us", lambda plan: index.match(plan.hashes), plans)
        lap("router_record_prompt_us", lambda plan: index.record("r0", plan.hashes), plans)
        done = lap("router_answer_hash_us", lambda mp: hasher.prompt([*mp[0], answer], mp[1]), list(zip(batch, plans)))
        lap("router_record_answer_us", lambda hashed: index.record("r0", hashed.hashes), done)
    return {name: sorted(ts)[len(ts) // 2] * 1e6 for name, ts in laps.items()}


def _serve_page(page: str, port: int) -> None:  # the child process
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    text = Path(page).read_text()
    app = FastAPI()
    app.get("/metrics")(lambda: PlainTextResponse(text))
    app.get("/v1/models")(lambda: {"object": "list", "data": [{"id": "m", "root": "m"}]})
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def measure_gets(page: str, rounds: int = 7, scale: float = 1.0) -> dict[str, float]:
    """CPU µs per GET of the client, httpx's and PooledGets, of `page` as /metrics and of /v1/models."""
    import httpx

    from kvgate.middleware.forward.http_gets import PooledGets
    from kvgate.tools.bench.procs import free_port

    port = free_port()
    server = multiprocessing.get_context("spawn").Process(target=_serve_page, args=(page, port), daemon=True)
    server.start()
    base = f"http://127.0.0.1:{port}"
    calls = max(1, int(200 * scale))

    async def timed(make: Callable[[], Any], path: str) -> float:
        out = []
        async with make() as client:
            for _ in range(5):  # connected, warm
                await client.get(base + path)
            for _ in range(rounds):
                started = time.process_time()
                for _ in range(calls):
                    await client.get(base + path)
                out.append((time.process_time() - started) / calls * 1e6)
        return sorted(out)[len(out) // 2]

    async def run() -> dict[str, float]:
        for _ in range(100):  # the server's start
            try:
                async with httpx.AsyncClient() as probe:
                    await probe.get(f"{base}/v1/models")
                break
            except httpx.HTTPError:
                await asyncio.sleep(0.1)
        res = {}
        for path, name in (("/metrics", "metrics_page"), ("/v1/models", "models")):
            res[f"get_{name}_httpx_us"] = await timed(httpx.AsyncClient, path)
            res[f"get_{name}_pooled_us"] = await timed(PooledGets, path)
        return res

    try:
        return {k: round(v, 2) for k, v in asyncio.run(run()).items()}
    finally:
        server.terminate()
        server.join(5)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kvgate.tools.bench.hot_parts", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7, help="rounds per piece (the median is reported)")
    p.add_argument("--scale", type=float, default=1.0, help="calls per round, relative to the defaults")
    p.add_argument("--gets", metavar="PAGE", help="also time the background GETs of this /metrics page")
    args = p.parse_args(argv)
    out = measure(args.rounds, args.scale)
    if args.gets:
        out.update(measure_gets(args.gets, args.rounds, args.scale))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
