"""A small OpenAI-compatible server that answers deterministically and counts its calls.

It is the backend of `make demo` (`kvgate demo-backend`) and the far end of tests and benchmarks: no model, just `Answer <n>: <question>`, where n is the
call number, so a test can tell a cached answer from a fresh one. Triggers in the last user message:
`[[length]]` ends with finish_reason "length"; `[[fail]]` answers 500; `[[sleep=S]]` waits S seconds;
`[[fixed]]` answers `Answer: <question>` (the same text on every call and server, like a greedy model).
`break_streams_after=K` makes the server cut every stream after K content chunks (a replica dying
mid-stream); `delay_s` delays every answer (a slow or, beyond the caller's timeout, hung replica);
`chunk_gap_s` spaces a stream's content chunks as an engine's decode steps do (each its own write,
so a proxy reads and relays each one on its own wake-up instead of several in one read).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


@dataclass
class Calls:
    count: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, body: dict[str, Any]) -> int:
        with self.lock:
            self.count += 1
            self.bodies.append(body)
            return self.count


def _last_user(body: dict[str, Any]) -> str:
    for msg in reversed(body.get("messages") or []):
        if msg.get("role") == "user":
            content = msg.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


class BrokenStream(Exception):
    """Raised inside a streaming response: the server drops the connection mid-body."""


def create_fake_app(
    calls: Calls | None = None, break_streams_after: int | None = None, delay_s: float = 0.0, chunk_gap_s: float = 0.0
) -> FastAPI:
    calls = calls or Calls()
    app = FastAPI()
    app.state.calls = calls

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "test"}]}

    @app.get("/health")
    async def health() -> dict[str, Any]:  # what routers (sglang-router) probe before sending traffic
        return {"status": "ok"}

    @app.get("/calls")
    async def count() -> dict[str, Any]:
        return {"count": calls.count}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        n = calls.record(body)
        if delay_s:
            await asyncio.sleep(delay_s)
        question = _last_user(body)
        if "[[fail]]" in question:
            return JSONResponse(
                {"error": {"message": "fake backend exploded", "type": "server_error"}}, status_code=500
            )
        sleep = re.search(r"\[\[sleep=([0-9.]+)\]\]", question)
        if sleep:
            await asyncio.sleep(float(sleep.group(1)))
        answer = f"Answer: {question}" if "[[fixed]]" in question else f"Answer {n}: {question}"
        long = re.search(r"\[\[long=([0-9]+)\]\]", question)
        if long:  # an answer far longer than its question
            answer += " padding" * (int(long.group(1)) // 8)
        finish = "length" if "[[length]]" in question else "stop"
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(answer.split()),
            "total_tokens": prompt_tokens + len(answer.split()),
        }
        rid, created, model = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time()), body.get("model", "fake")
        if not body.get("stream"):
            return {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": finish}],
                "usage": usage,
            }

        async def events() -> Any:
            base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
            first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            yield f"data: {json.dumps({**base, 'choices': [first]})}\n\n"
            for sent, word in enumerate(w for w in re.findall(r"\S*\s*", answer) if w):
                if break_streams_after is not None and sent >= break_streams_after:
                    raise BrokenStream("fake backend cut the stream")
                if word:
                    if chunk_gap_s and sent:
                        await asyncio.sleep(chunk_gap_s)
                    piece = {"index": 0, "delta": {"content": word}, "finish_reason": None}
                    yield f"data: {json.dumps({**base, 'choices': [piece]})}\n\n"
            yield f"data: {json.dumps({**base, 'choices': [{'index': 0, 'delta': {}, 'finish_reason': finish}]})}\n\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        """vLLM's /v1/completions shape: `Answer <n>: <prompt>` per prompt (token ids read as text)."""
        body = await request.json()
        n = calls.record(body)
        prompt = body.get("prompt")
        prompts = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else [prompt]
        texts = [p if isinstance(p, str) else " ".join(map(str, p or [])) for p in prompts]
        if any("[[fail]]" in t for t in texts):
            return JSONResponse(
                {"error": {"message": "fake backend exploded", "type": "server_error"}}, status_code=500
            )
        answers = [f"Answer: {t}" if "[[fixed]]" in t else f"Answer {n}: {t}" for t in texts]
        finish = "length" if any("[[length]]" in t for t in texts) else "stop"
        prompt_tokens = sum(len(t.split()) for t in texts)
        done = sum(len(a.split()) for a in answers)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done}
        rid, created, model = f"cmpl-{uuid.uuid4().hex[:12]}", int(time.time()), body.get("model", "fake")
        if not body.get("stream"):
            return {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "usage": usage,
                "choices": [
                    {"index": i, "text": a, "logprobs": None, "finish_reason": finish} for i, a in enumerate(answers)
                ],
            }

        async def events() -> Any:
            base = {"id": rid, "object": "text_completion", "created": created, "model": model}
            for i, answer in enumerate(answers):
                for word in (w for w in re.findall(r"\S*\s*", answer) if w):
                    piece = {"index": i, "text": word, "logprobs": None, "finish_reason": None}
                    yield f"data: {json.dumps({**base, 'choices': [piece]})}\n\n"
                last = {"index": i, "text": "", "logprobs": None, "finish_reason": finish}
                yield f"data: {json.dumps({**base, 'choices': [last]})}\n\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def serve_demo(host: str, port: int, chunk_gap_s: float = 0.0) -> int:
    """`kvgate demo-backend`: the fake app on (host, port) until stopped; the exit status."""
    import uvicorn

    print(f"kvgate demo backend (echoes 'Answer <n>: <question>') on http://{host}:{port}/v1", flush=True)
    # keeps idle connections longer than the relay's pool does (kvgate.middleware.forward.relay.KEEPALIVE_S)
    uvicorn.run(
        create_fake_app(chunk_gap_s=chunk_gap_s), host=host, port=port, log_level="warning", timeout_keep_alive=75
    )
    return 0
