"""Turn a stored chat completion into the stream of chunks a backend would have sent.

Invariant: concatenating the replayed content deltas of a choice gives back its stored content
exactly, so a streamed hit reads the same as the original answer.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Iterator

_PIECE = re.compile(r"\S*\s*")
WORDS_PER_CHUNK = 3


def split_text(text: str, words_per_chunk: int = WORDS_PER_CHUNK) -> list[str]:
    """Split into chunks of a few words; ''.join(split_text(t)) == t for every string t."""
    pieces = [p for p in _PIECE.findall(text) if p]
    return ["".join(pieces[i : i + words_per_chunk]) for i in range(0, len(pieces), words_per_chunk)]


def replay_chunks(response: dict[str, Any], include_usage: bool = False) -> Iterator[dict[str, Any]]:
    """OpenAI `chat.completion.chunk` dicts for a stored `chat.completion` dict."""
    base = {
        "id": response.get("id") or f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": response.get("model", ""),
    }
    if response.get("system_fingerprint"):
        base["system_fingerprint"] = response["system_fingerprint"]

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}

    for choice in response.get("choices", []):
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        yield chunk(index, {"role": message.get("role", "assistant"), "content": ""})
        for piece in split_text(message.get("content") or ""):
            yield chunk(index, {"content": piece})
        for i, call in enumerate(message.get("tool_calls") or []):
            yield chunk(index, {"tool_calls": [{"index": i, **call}]})
        yield chunk(index, {}, choice.get("finish_reason") or "stop")
    if include_usage and response.get("usage"):
        yield {**base, "choices": [], "usage": response["usage"]}
