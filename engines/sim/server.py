"""`kvgate sim-replica`: an OpenAI-compatible server in front of one SimEngine.

Routing benchmarks start N of these and replay a trace against them; each answers like an engine
whose prefix cache and timing follow one of two models (`--sim-model`): fifo, kvgate.engines.sim.engine
(LRU prefix cache, one FIFO prefill queue; read its docstring for what a "token" is), or batched,
kvgate.engines.sim.batched (continuous batching with a per-step token budget and chunked prefill, block
cache with pinning and leaf-first eviction). Both answer, count and publish events alike.

Endpoints
    POST /v1/chat/completions  non-stream and stream (SSE). The answer is deterministic:
        "[NAME]" followed by filler words, completion_tokens (= max_tokens, default 16) words in
        all. Usage always carries prompt_tokens, completion_tokens, total_tokens and
        prompt_tokens_details.cached_tokens. Streaming: nothing is sent before prefill ends; the
        first chunk (role + first word) comes at TTFT, the rest in up to STREAM_PIECES chunks over
        the decode time, then a chunk with finish_reason "stop". With
        stream_options.include_usage the usage follows in OpenAI's own usage-only chunk
        (choices: []); without it, usage rides on the finish chunk.
        Non-stream responses also carry x-sim-cached-tokens, x-sim-queue-ms, x-sim-prefill-ms
        (the modelled prefill), x-sim-ttft-ms.
    POST /v1/chat/completions/render ({"token_ids": [...]}) and POST /tokenize ({"count",
        "max_model_len", "tokens"}): the prompt's token ids, as vLLM serves them to routers that
        route on tokens (vllm-router asks for them before choosing a worker).
    GET /v1/models, GET /health ({status, name, ...stats}), GET /stats (?ttfts=true adds each
    request's engine-side TTFT since reset: the client's TTFT minus it is the router's part), POST /reset (empty the
    cache and zero the counters between benchmark runs).
Every response carries `x-sim-replica: NAME`. Bad requests get a 400 in OpenAI's error format.

KV events: with `--events-endpoint tcp://127.0.0.1:PORT` the replica binds a ZMQ PUB socket there
and publishes BlockStored / BlockRemoved / AllBlocksCleared in vLLM's format
(kvgate.index.kv.kv_events.ZmqEventPublisher), one batch per engine callback, so a router can run its
prefix index in precise mode against sim replicas exactly as against vLLM.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from contextlib import aclosing
from typing import Any, AsyncIterator, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvgate.engines.api import (
    ChatCall,
    ReplicaHeader,
    install_error_handler,
    parse_chat,
    publisher_callbacks,
    read_json,
    sse,
)
from kvgate.engines.sim.base import PrefillInfo, SimRequest
from kvgate.engines.sim.batched import DEFAULT_STEP_TOKENS, BatchedEngine
from kvgate.engines.sim.engine import DEFAULT_OVERHEAD_S, SimEngine

MAX_MODEL_LEN = 1 << 20  # reported by /tokenize; the simulation has no context limit
STREAM_PIECES = 16  # decode is streamed in at most this many chunks after the first token
FILLER = (
    "lorem",
    "ipsum",
    "dolor",
    "sit",
    "amet",
    "consectetur",
    "adipiscing",
    "elit",
    "sed",
    "do",
    "eiusmod",
    "tempor",
    "incididunt",
    "ut",
    "labore",
    "et",
)


def answer_words(name: str, n: int) -> list[str]:
    """The deterministic answer of replica `name`: n words, "[name]" then filler."""
    return ([f"[{name}]"] + [FILLER[i % len(FILLER)] for i in range(max(0, n - 1))])[: max(1, n)]


def usage_json(info: PrefillInfo, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": info.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": info.prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": info.cached_tokens},
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


Engine = SimEngine | BatchedEngine


def create_sim_app(engine: Engine, name: str = "sim", model: str = "sim") -> FastAPI:
    """The HTTP face of one SimEngine; `name` tags answers and the x-sim-replica header,
    `model` is what /v1/models lists (any requested model name is accepted)."""
    app = FastAPI(title=f"kvgate sim replica {name}")
    app.state.engine = engine
    app.add_middleware(ReplicaHeader, name=name)

    install_error_handler(app)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        call = parse_chat(read_json(await request.body()))
        req = engine.request(call.messages, call.max_tokens)
        words = answer_words(name, req.completion_tokens)
        rid, created = f"chatcmpl-sim-{uuid.uuid4().hex[:12]}", int(time.time())
        if call.stream:
            return StreamingResponse(_stream(engine, req, words, call, rid, created), media_type="text/event-stream")
        info = await engine.complete(req)
        payload = {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": call.model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": " ".join(words)}, "finish_reason": "stop"}
            ],
            "usage": usage_json(info, req.completion_tokens),
        }
        headers = {
            "x-sim-cached-tokens": str(info.cached_tokens),
            "x-sim-queue-ms": _ms(info.queue_s),
            "x-sim-prefill-ms": _ms(info.prefill_s),
            "x-sim-ttft-ms": _ms(info.ttft_s),
        }
        return JSONResponse(payload, headers=headers)

    @app.post("/v1/chat/completions/render")
    async def render(request: Request) -> dict[str, Any]:
        """vLLM's render endpoint: the prompt's token ids as this engine tokenizes it (routers
        that route on token ids, such as vllm-router's cache_aware policy, ask for them)."""
        call = parse_chat(read_json(await request.body()))
        return {"token_ids": engine.request(call.messages, 1).tokens}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        """vLLM's /tokenize: {"messages": [...]} (rendered as for a chat request) or {"prompt": text}."""
        body = read_json(await request.body())
        if isinstance(body, dict) and isinstance(body.get("prompt"), str):
            tokens = engine.tokenizer.encode(body["prompt"])
        else:
            tokens = engine.request(parse_chat(body).messages, 1).tokens
        return {"count": len(tokens), "max_model_len": MAX_MODEL_LEN, "tokens": tokens}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": f"kvgate-sim:{name}"}]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "name": name, **engine.stats()}

    @app.get("/stats")
    async def stats(ttfts: bool = False) -> dict[str, Any]:
        """Counters and state; with ?ttfts=true also every request's engine-side TTFT since reset."""
        return {**engine.stats(), "ttfts": engine.ttfts()} if ttfts else engine.stats()

    @app.post("/reset")
    async def reset() -> dict[str, Any]:
        engine.reset()
        return {"status": "ok", "name": name, **engine.stats()}

    return app


async def _stream(
    engine: Engine, req: SimRequest, words: Sequence[str], call: ChatCall, rid: str, created: int
) -> AsyncIterator[bytes]:
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": call.model}
    info: PrefillInfo | None = None
    async with aclosing(engine.generate(req, pieces=STREAM_PIECES)) as steps:
        async for step in steps:
            info = step.prefill
            text = " ".join(words[step.start : step.end])
            delta = {"role": "assistant", "content": text} if step.first else {"content": " " + text}
            yield sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    assert info is not None
    usage = usage_json(info, req.completion_tokens)
    final: dict[str, Any] = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    if not call.include_usage:
        final["usage"] = usage
    yield sse(final)
    if call.include_usage:
        yield sse({**base, "choices": [], "usage": usage})
    yield b"data: [DONE]\n\n"


# -- command line ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `kvgate sim-replica`. Token counts and rates are in the tokenizer's tokens
    (characters for the default "text" tokenizer)."""
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--name", default=None, help="replica name in answers and x-sim-replica (default sim-PORT)")
    parser.add_argument("--model", default="sim", help="model id listed by /v1/models (any name is accepted)")
    parser.add_argument("--capacity-tokens", type=int, required=True, help="prefix cache size in tokens")
    parser.add_argument(
        "--prefill-tps", type=float, required=True, help="prefill rate, tokens/s (one queue per replica)"
    )
    parser.add_argument("--decode-tps", type=float, required=True, help="decode rate per request, tokens/s")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per cached block (default 16)")
    parser.add_argument(
        "--sim-model",
        choices=["fifo", "batched"],
        default="fifo",
        help="fifo: serial prefill queue + free decode; batched: continuous batching, chunked prefill",
    )
    parser.add_argument(
        "--overhead-ms",
        type=float,
        default=None,
        help=f"fifo: fixed prefill cost per request (default {DEFAULT_OVERHEAD_S * 1000:g}); "
        "batched: fixed cost per step (default 1000/decode_tps - 1000/prefill_tps)",
    )
    parser.add_argument(
        "--step-tokens",
        type=int,
        default=DEFAULT_STEP_TOKENS,
        help="batched: token budget per step (decodes first, then prefill chunks)",
    )
    parser.add_argument(
        "--tokenizer",
        default="text",
        help="text (one token per character, default) | smollm2 | a local HF tokenizer dir",
    )
    parser.add_argument(
        "--events-endpoint",
        default=None,
        metavar="tcp://127.0.0.1:PORT",
        help="publish KV cache events (vLLM format, ZMQ PUB bound here)",
    )
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])


def build_engine(args: argparse.Namespace, publisher: Any = None) -> Engine:
    """The engine of `--sim-model` from parsed `add_arguments` options (ValueError on bad
    values); engine callbacks go to `publisher` when given."""
    callbacks = publisher_callbacks(publisher, args.block_size) if publisher is not None else {}
    overhead = None if args.overhead_ms is None else args.overhead_ms / 1000
    if getattr(args, "sim_model", "fifo") == "batched":
        return BatchedEngine(
            args.capacity_tokens,
            args.block_size,
            prefill_tps=args.prefill_tps,
            decode_tps=args.decode_tps,
            tokenizer=args.tokenizer,
            overhead_s=overhead,
            step_tokens=args.step_tokens,
            **callbacks,
        )
    return SimEngine(
        args.capacity_tokens,
        args.block_size,
        prefill_tps=args.prefill_tps,
        decode_tps=args.decode_tps,
        tokenizer=args.tokenizer,
        overhead_s=DEFAULT_OVERHEAD_S if overhead is None else overhead,
        **callbacks,
    )


def run(args: argparse.Namespace) -> int:
    """Serve one replica until interrupted; 2 on bad options."""
    import uvicorn

    publisher = None
    try:
        if args.events_endpoint:
            import zmq

            from kvgate.index.kv.kv_events import ZmqEventPublisher

            try:
                publisher = ZmqEventPublisher(args.events_endpoint)
            except zmq.ZMQError as exc:
                raise ValueError(f"--events-endpoint {args.events_endpoint}: {exc}") from None
        engine = build_engine(args, publisher)
    except (ValueError, FileNotFoundError) as exc:
        print(f"kvgate sim-replica: error: {exc}", file=sys.stderr)
        if publisher is not None:
            publisher.close()
        return 2
    name = args.name or f"sim-{args.port}"
    events = f", KV events on {publisher.endpoint}" if publisher is not None else ""
    print(
        f"kvgate sim-replica {name} on http://{args.host}:{args.port}/v1: cache {engine.capacity_tokens} tokens "
        f"({args.capacity_tokens // args.block_size} blocks of {args.block_size}), prefill {args.prefill_tps:g} tok/s, "
        f"decode {args.decode_tps:g} tok/s, model {args.sim_model}, tokenizer {engine.tokenizer.name}{events}",
        flush=True,
    )
    try:
        uvicorn.run(create_sim_app(engine, name, args.model), host=args.host, port=args.port, log_level=args.log_level)
    finally:
        if publisher is not None:
            publisher.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kvgate sim-replica", description="a simulated engine replica (prefix cache + timing model)"
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    # `python -m kvgate.engines.sim.server` owns its process: the same defaults `kvgate sim-replica` sets
    # (middleware/cli.py), before a tokenizer loads
    from kvgate.index.storage.env import offline_defaults

    os.environ.update(offline_defaults(os.environ))
    sys.exit(main())
