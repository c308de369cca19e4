"""Answers as the cache sees them: their text, price and cacheability, a streamed one put back
together for storage, a stored one replayed as chunks, and the CacheInfo tag on what we return.

Pure helpers over LiteLLM's objects and plain dicts; no I/O, no pipeline state.
"""

from __future__ import annotations

import json
import logging
from typing import Any, AsyncIterator, Iterable, Iterator

import orjson

from kvgate.middleware.litellm_env import litellm  # before any import from litellm

# isort: split

from litellm import ModelResponse
from litellm.types.utils import ModelResponseStream

from kvgate.middleware.replay import replay_chunks
from kvgate.middleware.text_answers import DONE

log = logging.getLogger("kvgate.answers")
# LiteLLM's own bookkeeping in its objects' dumps: never on the wire
LITELLM_ONLY_FIELDS = frozenset({"provider_specific_fields", "moderation"})
# An answer cut short or withheld is not an answer worth serving again.
UNCACHEABLE_FINISH = frozenset({"length", "content_filter"})


def cacheable(response: dict[str, Any]) -> bool:
    """True when every choice finished normally (not cut by length or withheld)."""
    choices = response.get("choices") or []
    return bool(choices) and all(c.get("finish_reason") not in UNCACHEABLE_FINISH for c in choices)


def answer_text(payload: dict[str, Any]) -> str | None:
    """Content of choice 0 of a full answer (None for tool calls and the like)."""
    choices = payload.get("choices") or []
    message = (choices[0].get("message") or {}) if choices else {}
    content = message.get("content") if message else (choices[0].get("text") if choices else None)
    return content if isinstance(content, str) else None


def streamed_text(chunks: list[Any]) -> str:
    """Content of choice 0 from stream chunks (what the replica generated)."""
    parts = []
    for chunk in chunks:
        choices = getattr(chunk, "choices", None) or []
        delta = getattr(choices[0], "delta", None) if choices else None
        # a chat chunk's delta, or a completions chunk's text
        content = (
            getattr(delta, "content", None)
            if delta is not None
            else getattr(choices[0], "text", None)
            if choices
            else None
        )
        if content:
            parts.append(content)
    return "".join(parts)


def assemble(chunks: list[Any], messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The full answer a stream's chunks make up, as a dict; None when it cannot be rebuilt."""
    if not chunks:
        return None
    try:
        built = litellm.stream_chunk_builder(chunks, messages=messages)
    except Exception as exc:  # an answer we cannot rebuild is not stored
        log.warning("could not assemble streamed answer for storage: %s", exc)
        return None
    return built.model_dump() if built is not None else None


def cost(payload: dict[str, Any], model: str) -> float | None:
    """USD price of an answer where LiteLLM's local price map knows the model; None where it has
    no price for it (the caller may remember that: the lookup is not cheap)."""
    try:
        return float(litellm.completion_cost(completion_response=ModelResponse(**payload), model=model) or 0.0)
    except Exception:  # unknown model / price: no estimate
        return None


def tag(response: Any, info: Any) -> None:
    """Put the CacheInfo where SDK users read it: `response._hidden_params["kvgate"]`."""
    hidden = getattr(response, "_hidden_params", None)
    if isinstance(hidden, dict):
        hidden["kvgate"] = info
        hidden["cache_hit"] = info.cache != "miss"
    elif hidden is not None:  # text completions carry a HiddenParams model (extra fields allowed)
        hidden.kvgate = info
        hidden.cache_hit = info.cache != "miss"


def served_response(stored: dict[str, Any], info: Any) -> ModelResponse:
    """A stored answer as we return it, tagged."""
    response = ModelResponse(**_public(stored))
    tag(response, info)
    return response


def replayed(stored: dict[str, Any], info: Any, include_usage: bool) -> "Replay":
    """A stored answer as the stream of tagged chunks a backend would have sent."""
    chunks = [ModelResponseStream(**c) for c in replay_chunks(_public(stored), include_usage)]
    for chunk in chunks:
        tag(chunk, info)
    return Replay(chunks)


class Replay:
    """A hit's chunks, already in memory: an async iterator that is also a sync one, so the sync
    face serves it without a trip to its loop per chunk."""

    def __init__(self, chunks: Iterable[Any]) -> None:
        self._chunks: Iterator[ModelResponseStream] = iter(chunks)

    def __iter__(self) -> Iterator[ModelResponseStream]:
        return self

    def __next__(self) -> ModelResponseStream:
        return next(self._chunks)

    def __aiter__(self) -> AsyncIterator[ModelResponseStream]:
        return self

    async def __anext__(self) -> ModelResponseStream:
        for chunk in self._chunks:
            return chunk
        raise StopAsyncIteration

    def close(self) -> None:
        self._chunks = iter(())

    async def aclose(self) -> None:
        self.close()


def openai_json(value: Any) -> Any:
    """Drop LiteLLM's own bookkeeping fields so clients see OpenAI's wire format."""
    if isinstance(value, dict):
        return {k: openai_json(v) for k, v in value.items() if k not in LITELLM_ONLY_FIELDS}
    if isinstance(value, list):
        return [openai_json(v) for v in value]
    return value


def wire_events(stored: dict[str, Any], include_usage: bool) -> list[bytes]:
    """A stored chat answer as the proxy's SSE events, [DONE] last: the chunks `replayed` makes,
    written as the wire has them (OpenAI's `finish_reason: null` included) without a trip through
    LiteLLM's objects."""
    events = [b"data: " + json_bytes(c) + b"\n\n" for c in replay_chunks(_on_wire(stored), include_usage)]
    return [*events, DONE]


def wire_body(stored: dict[str, Any]) -> bytes:
    """A stored chat answer as the proxy's JSON body: the answer as it was stored (the replica's
    own JSON for a relayed miss), without our bookkeeping or LiteLLM's."""
    return json_bytes(_on_wire(stored))


def json_bytes(value: Any) -> bytes:
    """Compact JSON: orjson's, or json's for what orjson refuses (an integer past 64 bits, which a
    client may send and an engine is the one to judge; a lone surrogate, escaped)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(value, separators=(",", ":")).encode()


def _on_wire(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored answer without our bookkeeping or LiteLLM's."""
    return openai_json(_public(stored))


def _public(stored: dict[str, Any]) -> dict[str, Any]:
    """Without our own bookkeeping fields (`_kvgate_cost_usd`…)."""
    return {k: v for k, v in stored.items() if not k.startswith("_kvgate")}
