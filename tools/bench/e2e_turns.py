"""The client side of `kvgate bench e2e`: each conversation's opening, its streamed turns with TTFT
as the client sees it, and the seeded schedule of arrivals and thinking pauses."""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass

import httpx

from kvgate.tools.bench.records import fit, sentences

SYSTEM = "You are a careful clerk. Answer briefly from the records."
FOLLOW_UPS = (
    "Which place is mentioned most often?",
    "Summarise the records in one sentence.",
    "What was weighed?",
    "Which record mentions a lighthouse?",
    "What happened on the latest day?",
    "List two places.",
    "Was anything lost?",
    "Give the records a title.",
)


def openings(k: int, lo: int, hi: int) -> list[tuple[list[dict[str, str]], int]]:
    """Per conversation, its first messages and their prompt tokens (SmolLM2's chat template)."""
    from kvgate.index.kv.tokenizer import load_tokenizer

    tok = load_tokenizer("smollm2")
    out = []
    for i in range(k):
        target = lo + (hi - lo) * i // max(1, k - 1)
        seed = 100 + i

        def build(n: int, seed: int = seed) -> list[dict[str, str]]:
            facts = "\n".join(sentences(seed, n))
            return [
                {"role": "system", "content": SYSTEM},
                {
                    "role": "user",
                    "content": f"Here are the records of ledger {seed}:\n{facts}\nWhat does record {seed}.0 say?",
                },
            ]

        out.append(fit(build, lambda m: len(tok.encode_messages(m)), target, hi=max(4, target // 4)))
    return out


@dataclass
class Turn:
    """One request of a conversation and what came back (timings in seconds, None when not reached)."""

    conversation: int
    turn: int
    ttft_s: float | None = None
    total_s: float | None = None
    replica: str | None = None
    prompt_tokens: int | None = None  # from the usage the proxy relays, when it does
    cached_tokens: int | None = None
    answer: str = ""
    error: str | None = None


def stream_turn(client: httpx.Client, url: str, messages: list[dict[str, str]], max_tokens: int, rec: Turn) -> None:
    """One streamed request; fills `rec` (errors recorded, never raised)."""
    body = {
        "model": "smollm2",
        "messages": messages,
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    parts: list[str] = []
    sent = time.perf_counter()
    try:
        with client.stream("POST", url, json=body) as resp:
            rec.replica = resp.headers.get("x-kvgate-replica")
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {resp.read()[:200]!r}"
                return
            for line in resp.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    rec.error = str(chunk["error"])[:200]
                    return
                for choice in chunk.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if rec.ttft_s is None:
                            rec.ttft_s = time.perf_counter() - sent
                        parts.append(content)
                usage = chunk.get("usage")
                if usage:
                    rec.prompt_tokens = usage.get("prompt_tokens")
                    rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    except (httpx.HTTPError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:200]
        return
    rec.total_s = time.perf_counter() - sent
    if rec.ttft_s is None:  # the first token was EOS: the answer is empty, the first token still came
        rec.ttft_s = rec.total_s
    rec.answer = "".join(parts)


def arrivals(k: int, mean_gap_s: float, seed: int) -> list[float]:
    """Start offsets of k conversations: 0 for the first, then seeded exponential gaps of mean
    `mean_gap_s` (all 0 when it is 0). The same for every policy of a run."""
    if mean_gap_s <= 0:
        return [0.0] * k
    rng, at, out = random.Random(f"{seed}:arrivals"), 0.0, []
    for _ in range(k):
        out.append(at)
        at += rng.expovariate(1 / mean_gap_s)
    return out


def converse(
    url: str,
    i: int,
    first: list[dict[str, str]],
    turns: int,
    max_tokens: int,
    think_s: float,
    seed: int,
    start: threading.Barrier,
    out: list[Turn],
    delay_s: float = 0.0,
) -> None:
    """Conversation `i`: wait for `start`, then `delay_s`, then `turns` streamed turns (a seeded pause
    before each follow-up), appending each Turn to `out`; stops at the first error."""
    messages = list(first)
    rng = random.Random(f"{seed}:{i}")
    with httpx.Client(timeout=httpx.Timeout(600.0), headers={"authorization": "Bearer e2e"}) as client:
        start.wait()
        if delay_s:
            time.sleep(delay_s)
        for t in range(turns):
            pause = rng.uniform(0, 2 * think_s)
            if t and pause:
                time.sleep(pause)
            rec = Turn(i, t)
            stream_turn(client, url, messages, max_tokens, rec)
            out.append(rec)
            if rec.error is not None:
                return  # the conversation cannot go on without its answer
            messages += [
                {"role": "assistant", "content": rec.answer},
                {"role": "user", "content": FOLLOW_UPS[(i + t) % len(FOLLOW_UPS)]},
            ]
