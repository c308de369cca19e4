"""The load generator of `kvgate bench vllm` (tools/bench/vllm_arena.py): conversations sent as
chat turns (or completions prompts) through one router, `concurrency` conversations at a time, each
one's turns in order. Every turn streams (temperature 0); its TTFT is the time from sending to the
first chunk with non-empty `delta.content` (completions: `text`), router included, read with the
relay's own HTTP/1.1 client (the same client for every router, as tools/bench/stream_client.py
measures the arena). Turn k's messages are the earlier user texts, the answers the engine returned
and the new text: later turns extend earlier prompts as a real chat does. With the completions
endpoint turn k's prompt is turn k-1's prompt, its answer and the new text
(vllm_arena_workload.next_prompt). After a failed turn the rest of that conversation is not sent.
Each turn keeps the replica a kvgate router names in its `x-kvgate-replica` response header, and
kvgate's `server-timing` (its steps before the first bytes, kvgate.middleware.server.timing), with
the time its response head arrived; the anchors send neither, so theirs stay None. With `place`, each turn goes straight to the engine it
names (the replay arm: no router in the path) and keeps that engine's name as its replica.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import orjson

from kvgate.middleware.forward.http1 import Pool
from kvgate.tools.bench.vllm_arena_workload import next_prompt

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass
class Turn:
    """One sent turn: where it belongs, its messages (or its completions prompt), and what came back."""

    conversation: int
    turn: int
    messages: list[dict[str, str]]
    prompt: str | None = None  # set: the turn goes to /v1/completions with this prompt, `messages` unused
    sent: float = 0.0  # perf_counter
    done: float = 0.0
    ttft: float | None = None
    error: str | None = None
    answer: str = ""
    prompt_tokens: int | None = None  # the engine's usage, when the router passed it on
    cached_tokens: int | None = None
    finish_reason: str | None = None
    first_piece: float | None = None  # perf_counter of the first and the last event that carried text
    last_piece: float | None = None
    replica: str | None = None  # x-kvgate-replica: where kvgate sent it (None through the anchors)
    timing: str | None = None  # kvgate's server-timing header
    expected_cached: int | None = None  # x-kvgate-expected-cached-tokens: the router's guess
    head: float = 0.0  # perf_counter when the response head arrived
    pieces: list[str] = field(default_factory=list, repr=False)


def inter_token_s(turn: Turn) -> float | None:
    """The mean gap between the events after the first that carried text (how a streaming client
    sees the answer come in; None with fewer than two pieces). A router that held events back
    would show here, not in the time to first token."""
    if turn.first_piece is None or turn.last_piece is None or len(turn.pieces) < 2:
        return None
    return (turn.last_piece - turn.first_piece) / (len(turn.pieces) - 1)


def inter_token_gaps(turns: Sequence[Turn]) -> list[float]:
    """`inter_token_s` of each turn that has one."""
    return [gap for t in turns if (gap := inter_token_s(t)) is not None]


def take_event(turn: Turn, event: dict[str, Any], now: float) -> None:
    """Fold one SSE event of a chat completion (or completion) stream into `turn`."""
    if "error" in event:
        turn.error = json.dumps(event["error"])[:200]
        return
    for choice in event.get("choices") or []:
        content = choice.get("text") if turn.prompt is not None else (choice.get("delta") or {}).get("content")
        if content:
            if turn.ttft is None:
                turn.ttft = now - turn.sent
            if turn.first_piece is None:
                turn.first_piece = now
            turn.last_piece = now
            turn.pieces.append(content)
        if choice.get("finish_reason"):
            turn.finish_reason = choice["finish_reason"]
            if turn.ttft is None:  # the first token generated was the end of the answer: still a first token
                turn.ttft = now - turn.sent
    usage = event.get("usage")
    if usage:
        turn.prompt_tokens = usage.get("prompt_tokens")
        turn.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")


async def send_turn(client: Pool, url: str, turn: Turn, model: str, max_tokens: int, timeout: float) -> None:
    """Stream one turn; never raises for the server's failures (they end in `turn.error`)."""
    what = {"messages": turn.messages} if turn.prompt is None else {"prompt": turn.prompt}
    body = orjson.dumps(
        {
            "model": model,
            **what,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    turn.sent = time.perf_counter()
    buf = b""
    try:
        resp = await client.post(
            url, body, {"content-type": "application/json", "authorization": "Bearer bench"}, timeout
        )
        turn.head = time.perf_counter()
        turn.replica = resp.headers.get("x-kvgate-replica")
        turn.timing = resp.headers.get("server-timing")
        if (expected := resp.headers.get("x-kvgate-expected-cached-tokens")) is not None:
            turn.expected_cached = int(expected)
        try:
            if resp.status != 200:
                turn.error = f"HTTP {resp.status}: {(await resp.read())[:200]!r}"
                return
            async for data in resp.chunks():
                now = time.perf_counter()
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    line = line.strip()
                    if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                        continue
                    try:
                        take_event(turn, orjson.loads(line[5:]), now)
                    except orjson.JSONDecodeError:
                        turn.error = f"bad event: {line[:200]!r}"
                    if turn.error is not None:
                        return
        finally:
            resp.close()
    except (ConnectionError, asyncio.TimeoutError, OSError) as exc:
        turn.error = f"{type(exc).__name__}: {exc}"
    finally:
        turn.done = time.perf_counter()
        turn.answer = "".join(turn.pieces)
    if turn.error is None and turn.ttft is None:
        turn.error = "stream ended without content"


async def converse(
    url: str,
    texts: Sequence[Sequence[str]],
    *,
    model: str,
    max_tokens: int,
    concurrency: int,
    timeout: float = 600.0,
    on_turn: Callable[[Turn], None] | None = None,
    endpoint: str = "chat",
    place: Callable[[Turn], tuple[str, str]] | None = None,
) -> list[Turn]:
    """Every conversation (`texts[c]`: its user messages), `concurrency` at a time in list order, as
    chat turns or (`endpoint` "completions") text prompts; the turns sent, in the order they were sent.
    `place(turn)` → (replica name, URL): where each turn goes instead of `url`."""
    sent: list[Turn] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for c in range(len(texts)):
        queue.put_nowait(c)
    client = Pool(
        keepalive_s=3.0,
        keep_headers=frozenset({"x-kvgate-replica", "server-timing", "x-kvgate-expected-cached-tokens"}),
    )

    async def worker() -> None:
        while not queue.empty():
            c = queue.get_nowait()
            messages: list[dict[str, str]] = []
            prompt = answer = ""
            for k, text in enumerate(texts[c]):
                if endpoint == "completions":
                    prompt = next_prompt(prompt, answer, text)
                    turn = Turn(c, k, [], prompt)
                else:
                    messages = [*messages, {"role": "user", "content": text}]
                    turn = Turn(c, k, messages)
                sent.append(turn)
                replica, target = place(turn) if place is not None else (None, url)
                await send_turn(client, target, turn, model, max_tokens, timeout)
                turn.replica = replica or turn.replica
                if on_turn is not None:
                    on_turn(turn)
                if turn.error is not None:
                    break
                answer = turn.answer
                messages = [*messages, {"role": "assistant", "content": answer}]

    try:
        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    finally:
        await client.aclose()
    return sent
