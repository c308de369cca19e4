"""Completions answers (`text_completion`) as the cache sees them: put back together from a stream,
served from the store, and replayed as a stream.

A streamed completions miss is stored with the events the replica sent (`_kvgate_sse`), so a
streamed hit sends the same bytes the miss's client read: the usage event only to a client that
asked for it, as on the miss. An answer stored from a non-streamed miss is replayed in vLLM's chunk
shape. Pure helpers over plain dicts and LiteLLM's objects; no I/O.

Invariant: the text of a replayed stream's choice 0, joined, is the stored answer's text.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

import orjson

from kvgate.middleware.litellm_env import litellm  # noqa: F401  (before any import from litellm)

# isort: split
from litellm.types.utils import TextCompletionResponse

from kvgate.middleware.replay import split_text

SSE_KEY = "_kvgate_sse"  # the stored stream's events, as sent by the replica


class Last(bytes):
    """A stream's final bytes, [DONE] at their end: the response body ends with them, in the same
    write (a relayed stream's last events ride with our [DONE] when they came with the replica's)."""


DONE = Last(b"data: [DONE]\n\n")


def public(stored: dict[str, Any]) -> dict[str, Any]:
    """Without our own bookkeeping fields."""
    return {k: v for k, v in stored.items() if not k.startswith("_kvgate")}


def streamed_text_answer(chunks: list[Any]) -> dict[str, Any] | None:
    """The `text_completion` dict a stream of LiteLLM text chunks makes up (choice 0); None when
    it did not finish or holds several choices."""
    if not chunks:
        return None
    texts, finish, usage = [], None, None
    for chunk in chunks:
        data = chunk.model_dump() if hasattr(chunk, "model_dump") else dict(chunk)
        choices = data.get("choices") or []
        if len(choices) > 1:
            return None
        if choices:
            texts.append(choices[0].get("text") or "")
            finish = choices[0].get("finish_reason") or finish
        if (data.get("usage") or {}).get("total_tokens"):  # LiteLLM puts a zero usage on every chunk
            usage = data["usage"]
    if finish is None:
        return None
    head = chunks[0].model_dump() if hasattr(chunks[0], "model_dump") else dict(chunks[0])
    answer = {
        "id": head.get("id"),
        "object": "text_completion",
        "created": head.get("created"),
        "model": head.get("model"),
        "choices": [{"index": 0, "text": "".join(texts), "logprobs": None, "finish_reason": finish}],
    }
    if usage:
        answer["usage"] = usage
    return answer


def served_text(stored: dict[str, Any]) -> TextCompletionResponse:
    """A stored answer as the SDK returns it."""
    return TextCompletionResponse(**public(stored))


def json_body(stored: dict[str, Any]) -> bytes:
    """A stored answer as the proxy's JSON body."""
    return orjson.dumps(public(stored))


def replay_events(stored: dict[str, Any], include_usage: bool) -> list[bytes]:
    """The SSE events of a streamed hit, [DONE] last: the stored stream's own events when there
    are some (the usage-only one kept only with `include_usage`), else vLLM-shaped chunks."""
    events = stored.get(SSE_KEY)
    if isinstance(events, list) and events:
        out = [e.encode("utf-8", "surrogatepass") for e in events if include_usage or not _usage_only(e)]
    else:
        out = [b"data: " + orjson.dumps(c) + b"\n\n" for c in replay_text_chunks(stored, include_usage)]
    return [*out, DONE]


def replay_text_chunks(stored: dict[str, Any], include_usage: bool) -> Iterator[dict[str, Any]]:
    """vLLM's `text_completion` stream chunks for a stored answer (choice by choice)."""
    base = {
        "id": stored.get("id") or f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": stored.get("created") or int(time.time()),
        "model": stored.get("model", ""),
    }
    for choice in stored.get("choices") or []:
        index = choice.get("index", 0)
        for piece in split_text(choice.get("text") or ""):
            yield {
                **base,
                "choices": [
                    {"index": index, "text": piece, "logprobs": None, "finish_reason": None, "stop_reason": None}
                ],
            }
        yield {
            **base,
            "choices": [
                {
                    "index": index,
                    "text": "",
                    "logprobs": None,
                    "finish_reason": choice.get("finish_reason") or "stop",
                    "stop_reason": None,
                }
            ],
        }
    if include_usage and stored.get("usage"):
        yield {**base, "choices": [], "usage": stored["usage"]}


def stream_objects(stored: dict[str, Any], include_usage: bool) -> Iterator[TextCompletionResponse]:
    """A streamed hit's chunks as the SDK iterates them, built as they are read (the proxy sends
    `replay_events` and never reads these)."""
    for event in replay_events(stored, include_usage)[:-1]:
        yield TextCompletionResponse(**orjson.loads(event.split(b"data:", 1)[1].strip()))


def _usage_only(event: str) -> bool:
    """An event that carries only the usage (no choices): sent to clients that asked for it."""
    if '"usage"' not in event:
        return False
    try:
        chunk = orjson.loads(event.split("data:", 1)[1].strip())
    except (orjson.JSONDecodeError, IndexError):
        return False
    return isinstance(chunk, dict) and bool(chunk.get("usage")) and not chunk.get("choices")
