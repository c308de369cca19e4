"""POST /v1/completions on the lean ASGI path: vLLM's request shape through the same pipeline as chat.

One prompt (a string or a list of token ids) is one pipeline request: looked up, routed and
stored on its own, and answered as the chat path answers (the replica's or the store's bytes).
A batch (a list of strings or of token-id lists) is split: each prompt is its own request, in
parallel, and the answers are joined in prompt order as vLLM joins them (choice `index` =
prompt position x n + choice; usage summed). The kvgate headers of a batch list each prompt's
value, comma separated, in prompt order; a batch has no Server-Timing header (its prompts run side
by side, so their steps do not add up).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from kvgate.middleware.errors import KvgateError
from kvgate.middleware.outcome import Result
from kvgate.middleware.pipeline import Pipeline
from kvgate.middleware.server.chat_asgi import ChatHandler, Scope, cache_headers, openai_json
from kvgate.middleware.text_answers import DONE

USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")


def prompts_of(prompt: Any) -> list[Any] | None:
    """The batch's prompts, or None for a single prompt (a string, or one list of token ids)."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return list(prompt)
    return None


class CompletionsHandler(ChatHandler):
    """POST /v1/completions as an ASGI app (behind the gates: the caller has a key)."""

    async def _serve(self, scope: Scope, receive: Any, send: Any) -> None:
        arrived = time.perf_counter()
        tenant, body, control = await self.request(scope, receive)
        pipeline: Pipeline = self.app.state.pipeline
        batch = prompts_of(body.get("prompt"))
        if batch is None:
            result = await pipeline.acomplete(body, tenant, control, raw=True, endpoint="completions")
            await self.respond(result, self.headers(result.info, arrived), scope, receive, send)
            return
        # every prompt is checked before any is sent: a bad one refuses the whole batch
        for i, prompt in enumerate(batch):
            _check(pipeline, {**body, "prompt": prompt}, tenant, control, i)
        results = await asyncio.gather(
            *(
                pipeline.acomplete({**body, "prompt": p}, tenant, control, raw=True, endpoint="completions")
                for p in batch
            )
        )
        headers = _joined([cache_headers(r.info) for r in results])
        n = body.get("n") or 1
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            merged = Result(results[0].info, raw=_merged_stream(results, n, include_usage))
        else:
            merged = Result(results[0].info, raw=orjson.dumps(_merged_json(results, n)))
        await self.respond(merged, headers, scope, receive, send)


def _check(pipeline: Pipeline, kwargs: dict[str, Any], tenant: str, control: Any, i: int) -> None:
    """The batch's prompt `i` as the pipeline will read it; its error names the prompt's place."""
    try:
        pipeline.view(kwargs, tenant, control, endpoint="completions")
    except KvgateError as exc:
        if exc.param == "prompt" or (exc.param or "").startswith("prompt["):
            exc.param = f"prompt[{i}]" + (exc.param or "")[len("prompt") :]
        raise


def _joined(headers: list[dict[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in dict.fromkeys(k for h in headers for k in h):
        out[name] = ",".join(h.get(name, "") for h in headers)
    return out


def _payload(result: Result) -> dict[str, Any]:
    if isinstance(result.raw, bytes):
        return orjson.loads(result.raw)
    assert result.response is not None
    return openai_json(result.response.model_dump())


def _merged_json(results: list[Result], n: int) -> dict[str, Any]:
    payloads = [_payload(r) for r in results]
    merged = {k: v for k, v in payloads[0].items() if k not in ("choices", "usage")}
    merged["choices"] = [
        {**c, "index": i * n + int(c.get("index") or 0)} for i, p in enumerate(payloads) for c in p.get("choices") or []
    ]
    usages = [p.get("usage") for p in payloads if isinstance(p.get("usage"), dict)]
    if usages:
        merged["usage"] = {f: sum(int(u.get(f) or 0) for u in usages) for f in USAGE_FIELDS}
    return merged


async def _merged_stream(results: list[Result], n: int, include_usage: bool) -> AsyncIterator[bytes]:
    """The prompts' streams one after the other, choice indexes moved to the prompt's place,
    one usage event (summed) at the end when asked for. Closing it (the client left) closes every
    prompt's stream, read or not, so each replica's books balance."""
    usage = dict.fromkeys(USAGE_FIELDS, 0)
    try:
        for i, result in enumerate(results):
            async for chunk in _events(result):
                data = chunk.get("choices")
                if chunk.get("usage"):
                    for f in USAGE_FIELDS:
                        usage[f] += int(chunk["usage"].get(f) or 0)
                    if not data:
                        continue
                    chunk = {k: v for k, v in chunk.items() if k != "usage"}
                if data:
                    chunk["choices"] = [{**c, "index": i * n + int(c.get("index") or 0)} for c in data]
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
    finally:
        for result in results:
            for stream in (result.raw, result.stream):
                close = getattr(stream, "aclose", None)
                if close is not None:
                    await close()
    if include_usage:
        yield b"data: " + orjson.dumps({"object": "text_completion", "choices": [], "usage": usage}) + b"\n\n"
    yield DONE


async def _events(result: Result) -> AsyncIterator[dict[str, Any]]:
    """One prompt's stream as event dicts ([DONE] left out; an error event passed on as a dict)."""
    if result.raw is not None:
        buffer = b""
        async for blob in result.raw:
            buffer += blob
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                data = event.split(b"data:", 1)[1].strip() if b"data:" in event else b""
                if data and data != b"[DONE]":
                    yield orjson.loads(data)
        return
    async for chunk in result.stream:
        yield openai_json(chunk.model_dump(exclude_none=True))
