"""Prompts and the client of `kvgate bench vllm-kv`: deterministic long conversations, and one
streamed chat turn timed to its first token, with the first token's top-20 logprobs.

A conversation's first turn is a user message of facts (distinct per conversation, so no two share
a prefix beyond the chat template) long enough for the wanted history; its next turn adds the
engine's own answer and a short question (well under 64 tokens), as a chat client would.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

COLORS = ("red", "blue", "green", "amber", "violet", "grey", "white", "black")
TOPICS = ("rivers", "mountains", "cities", "stars", "forests", "islands", "deserts", "harbours")
QUESTIONS = (
    "Which box holds the most marbles?",
    "Name two boxes that mention rivers.",
    "What colour is box number 14?",
    "Summarise the facts in one sentence.",
)
FACT_TOKENS = 21  # about the tokens one fact takes in SmolLM2's tokenizer


def first_message(conversation: int, history_tokens: int) -> str:
    n = max(4, history_tokens // FACT_TOKENS + 2)
    facts = " ".join(
        f"Fact {conversation}.{i}: the {COLORS[(i + conversation) % 8]} box number {i * 7 + conversation} holds "
        f"{(i * 13 + conversation * 31) % 97} marbles and a note about {TOPICS[(i * 3 + conversation) % 8]}."
        for i in range(n)
    )
    return f"Conversation {conversation}. Remember these facts. {facts}"


def next_turn(first: str, answer: str, conversation: int) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": first},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": QUESTIONS[conversation % len(QUESTIONS)]},
    ]


@dataclass
class Reply:
    ttft_s: float
    text: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    total_s: float
    top: dict[str, float] = field(default_factory=dict)  # first token's top-20: token → logprob


def ask(
    api_base: str,
    messages: list[dict[str, str]],
    *,
    max_tokens: int = 32,
    logprobs: bool = True,
    ignore_eos: bool = False,
    timeout: float = 300.0,
) -> Reply:
    """One greedy streamed turn; raises on any HTTP or engine error (the bench counts none as fine)."""
    body: dict[str, Any] = {
        "model": "smollm2",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if logprobs:
        body.update(logprobs=True, top_logprobs=20)
    if ignore_eos:
        body["ignore_eos"] = True
    t0 = time.perf_counter()
    first: float | None = None
    text, usage, top = "", None, {}
    with httpx.stream("POST", f"{api_base}/chat/completions", json=body, timeout=timeout) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{api_base}: HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("error"):
                raise RuntimeError(f"{api_base}: {event['error']}")
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if first is None:
                        first = time.perf_counter()
                        content = ((choice.get("logprobs") or {}).get("content") or [{}])[0]
                        top = {t["token"]: t["logprob"] for t in content.get("top_logprobs") or []}
                    text += piece
    if first is None or usage is None:
        raise RuntimeError(f"{api_base}: no content or no usage in the stream")
    details = usage.get("prompt_tokens_details") or {}
    return Reply(
        first - t0,
        text,
        usage["prompt_tokens"],
        details.get("cached_tokens") or 0,
        usage.get("completion_tokens") or 0,
        time.perf_counter() - t0,
        top,
    )


def max_logprob_diff(a: dict[str, float], b: dict[str, float]) -> float | None:
    """Largest |Δ logprob| over tokens in both top-20 lists (None when they share none)."""
    shared = set(a) & set(b)
    return max((abs(a[t] - b[t]) for t in shared), default=None)


def decode_tps(api_base: str, index: int, tokens: int) -> float:
    """Decode tokens/s of one long generation (time after the first token)."""
    r = ask(
        api_base,
        [{"role": "user", "content": f"Story {index}: write a long tale about a lighthouse keeper."}],
        max_tokens=tokens,
        logprobs=False,
        ignore_eos=True,
    )
    return (r.completion_tokens - 1) / max(1e-9, r.total_s - r.ttft_s)
