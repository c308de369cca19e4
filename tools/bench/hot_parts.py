"""Micro timings of pieces of a relayed miss's path, each in one process, CPU time per call
(median of several rounds): the SSE parser over an 18-event stream, a two-message request view,
a group commit's request records, an answer's entry with its pointer and tenant row, a 40-block
prefix record. For comparing two trees of the code on the same machine (run it under each with
PYTHONPATH, alternately), where the end-to-end bench's spread hides a few percent.

    python -m kvgate.tools.bench.hot_parts [--rounds N] [--scale F]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from typing import Any, Callable

import orjson

from kvgate.index.kv.prefix import PrefixIndex
from kvgate.index.responses.entries.base import CacheEntry
from kvgate.index.responses.entries.disk import DiskEntryStore
from kvgate.middleware.cache.request_log import DiskRequestLog, RequestRecord, new_request_id
from kvgate.middleware.config import parse_config
from kvgate.middleware.forward.relay_events import SseParser
from kvgate.middleware.request import CacheControl, build_view

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


def _events() -> list[bytes]:
    head = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [
        {**head, "choices": [{"index": 0, "delta": {"content": w, **({"role": "assistant"} if i == 0 else {})}}]}
        for i, w in enumerate(WORDS)
    ]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks.append({**head, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21}})
    return [b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks]


def measure(rounds: int = 7, scale: float = 1.0) -> dict[str, float]:
    """Each piece's CPU µs per call (per record / entry where they come in batches of 8)."""
    n = lambda calls: max(1, int(calls * scale))  # noqa: E731
    out: dict[str, float] = {}
    events = _events()

    def stream() -> None:
        parser = SseParser(True)
        for event in events:
            parser.feed(event)
        parser.answer([])

    out["sse_stream_18_events_us"] = median_us(stream, n(2000), rounds)
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
    return {k: round(v, 2) for k, v in out.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kvgate.tools.bench.hot_parts", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7, help="rounds per piece (the median is reported)")
    p.add_argument("--scale", type=float, default=1.0, help="calls per round, relative to the defaults")
    args = p.parse_args(argv)
    print(json.dumps(measure(args.rounds, args.scale)))


if __name__ == "__main__":
    main()
