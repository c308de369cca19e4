"""Decode smoothness while histories load (`kvgate bench vllm-kv`): the p99 inter-token latency of
one running decode stream on an engine while other requests' long histories load from the
connector's disk tier into the same engine, against the same stream with nothing else running.
With loads beside the steps (the connector's background loads) the stream keeps its pace but for
the other requests' own prefill of their new turn."""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import httpx

from kvgate.tools.bench.vllm_kv_client import ask


def token_gaps(api_base: str, index: int, tokens: int, started: threading.Event | None = None) -> list[float]:
    """Seconds between consecutive streamed pieces of one greedy generation of `tokens` tokens
    (end of text ignored); `started` is set when the first piece arrives."""
    body = {
        "model": "smollm2",
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": f"Story {index}: write a long tale about a lighthouse keeper."}],
    }
    times: list[float] = []
    with httpx.stream("POST", f"{api_base}/chat/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{api_base}: HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if any((c.get("delta") or {}).get("content") for c in json.loads(line[6:]).get("choices") or []):
                times.append(time.perf_counter())
                if started is not None:
                    started.set()
    return [b - a for a, b in zip(times, times[1:])]


def p99(values: Sequence[float]) -> float | None:
    """Nearest-rank 99th percentile; None for no values. Invariant: one of `values`, >= all but 1%."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def itl_during_loads(api_base: str, tokens: int, loads: Sequence[list[dict[str, str]]]) -> dict[str, Any]:
    """The stream alone, then the same stream with `loads` (next turns whose history a tier holds)
    sent all at once after its first token."""
    quiet = token_gaps(api_base, 0, tokens)
    started, box = threading.Event(), {}
    stream = threading.Thread(target=lambda: box.update(gaps=token_gaps(api_base, 0, tokens, started)))
    stream.start()
    if not started.wait(300):
        raise RuntimeError(f"{api_base}: the decode stream never started")
    with ThreadPoolExecutor(max(1, len(loads))) as pool:
        replies = list(pool.map(lambda m: ask(api_base, m, max_tokens=4, logprobs=False), loads))
    stream.join()
    return {
        "itl_p99_during_loads_s": p99(box.get("gaps", [])),
        "itl_p99_no_loads_s": p99(quiet),
        "itl_median_during_loads_s": statistics.median(box["gaps"]) if box.get("gaps") else None,
        "itl_median_no_loads_s": statistics.median(quiet) if quiet else None,
        "loads_during_stream": len(loads),
        "loads_cached_tokens": [r.cached_tokens for r in replies],
        "loads_ttft_s": [round(r.ttft_s, 4) for r in replies],
    }
