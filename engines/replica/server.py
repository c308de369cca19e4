"""`kvgate replica`: an OpenAI-compatible server in front of one ReplicaEngine (a real CPU model
whose KV cache prefix is loaded from / saved to an kvgate.index.kv.chunks.ChunkStore).

Endpoints
    POST /v1/chat/completions  non-stream and stream (SSE, ending with `data: [DONE]`), OpenAI's
        format. Honoured: messages, max_tokens / max_completion_tokens (1..4096, default 256
        clipped to the context left), temperature (absent or 0 = greedy), top_p, stop (a string or
        up to 4), seed, stream, stream_options.include_usage; n must be 1. Any model name is
        accepted. Usage carries prompt_tokens_details.cached_tokens = prompt tokens whose KV came
        from the chunk store. Streaming: the first chunk (role + first text) is sent at TTFT;
        with include_usage the usage follows in OpenAI's usage-only chunk (choices: []), without
        it the usage rides on the finish chunk (as the sim replica does). A client that goes away
        cancels its generation within one decode step (streaming) or within
        kvgate.engines.replica.chat.DISCONNECT_POLL_S (non-streaming).
        Non-stream responses carry x-kvgate-cached-tokens, x-kvgate-ttft-ms, x-kvgate-prefill-ms.
    GET /v1/models, GET /health (cheap: never waits for the model), GET /stats (engine + store
    counters), GET /metrics (Prometheus text, one registry per app: per-request counters and
    histograms, and the KV store's per-tier counters read at scrape time; kvgate.engines.replica.metrics).
Every response carries `x-kvgate-replica: NAME`. Bad input gets a 400 in OpenAI's error format.

The model runs on the engine's own worker thread, which interleaves up to --max-running requests
step by step (prefill slices and decode steps; see kvgate.engines.replica.worker); the event loop only
tokenizes (in a thread) and relays text pieces, so /health answers during a long prefill.

KV events: with --events-endpoint the replica publishes BlockStored and BlockRemoved in vLLM's
format (block_size = --chunk-tokens, medium "CPU": its chunk store as a whole; "REMOTE" for
chunks only its --kv-remote Redis still holds) through
kvgate.index.kv.kv_events.ZmqEventPublisher; see kvgate.engines.replica.announce for what is announced, and why a
chunk is removed only when no tier holds it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from kvgate.engines.api import ReplicaHeader, install_error_handler, parse_chat, publisher_callbacks, read_json
from kvgate.engines.replica.chat import finish_unless_gone, parse_sampling, stream_chunks, submit
from kvgate.engines.replica.metrics import ReplicaMetrics
from kvgate.engines.replica.scheduling import MAX_RUNNING

if TYPE_CHECKING:  # the engine pulls in torch: imported where used, so `kvgate --help` stays quick
    from kvgate.engines.replica.engine import ReplicaEngine


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


def create_replica_app(engine: ReplicaEngine, name: str = "replica", model: str = "smollm2") -> FastAPI:
    """The HTTP face of one ReplicaEngine; `model` is what /v1/models lists. The caller owns the
    engine (closing it is not the app's job)."""
    app = FastAPI(title=f"kvgate replica {name}")
    app.add_middleware(ReplicaHeader, name=name, header=b"x-kvgate-replica")
    metrics = ReplicaMetrics(engine)
    app.state.engine, app.state.metrics = engine, metrics

    install_error_handler(app, lambda _: metrics.requests.labels(outcome="bad_request").inc())

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = read_json(await request.body())
        call = parse_chat(body)
        if not body.get("model"):
            call = dataclasses.replace(call, model=model)
        params = parse_sampling(body, call)
        tokens = await asyncio.to_thread(engine.prepare, call.messages, params)
        rid, created = f"chatcmpl-{uuid.uuid4().hex[:16]}", int(time.time())
        submission, events = submit(engine, tokens, params)
        if call.stream:
            return StreamingResponse(
                stream_chunks(submission, events, metrics, call, rid, created), media_type="text/event-stream"
            )
        try:
            result = await finish_unless_gone(request, submission, events)
        except Exception as exc:
            metrics.requests.labels(outcome="failed").inc()
            return JSONResponse(
                {
                    "error": {
                        "message": f"generation failed: {exc}",
                        "type": "internal_error",
                        "param": None,
                        "code": None,
                    }
                },
                status_code=500,
            )
        finally:
            submission.cancel()  # no-op when done; stops the model if this handler is cancelled
        metrics.observe(result)
        payload = {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": call.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": result.text},
                    "finish_reason": result.finish_reason,
                }
            ],
            "usage": result.usage(),
        }
        headers = {
            "x-kvgate-cached-tokens": str(result.cached_tokens),
            "x-kvgate-ttft-ms": _ms(result.ttft_s),
            "x-kvgate-prefill-ms": _ms(result.prefill_s),
        }
        return JSONResponse(payload, headers=headers)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": f"kvgate-replica:{name}"}]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        s = engine.stats(store=False)
        return {
            "status": "ok",
            "name": name,
            "queue_len": s["queue_len"],
            "running": s["running"],
            "requests": s["requests"],
        }

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return await asyncio.to_thread(engine.stats)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(await asyncio.to_thread(metrics.render), media_type=CONTENT_TYPE_LATEST)

    return app


# -- command line ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `kvgate replica`."""
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--name", default=None, help="replica name in x-kvgate-replica and /health (default replica-PORT)"
    )
    parser.add_argument(
        "--model", default="smollm2", help="smollm2 (the packaged SmolLM2-135M-Instruct) | a local HF model dir"
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights and KV dtype")
    parser.add_argument(
        "--kv-dir",
        type=Path,
        default=None,
        help="KV chunk store directory (may be shared by replicas of the same model); none = no store",
    )
    parser.add_argument("--kv-ram-mb", type=int, default=1024, help="RAM tier budget, MiB (0 = no RAM tier)")
    parser.add_argument(
        "--kv-tail-mb",
        type=int,
        default=256,
        help="RAM for each conversation's partial last chunk (not in the store), MiB (0 = off)",
    )
    parser.add_argument("--kv-disk-mb", type=int, default=8192, help="disk tier budget, MiB (0 = no disk tier)")
    parser.add_argument(
        "--kv-remote",
        default=None,
        metavar="URL",
        help="remote KV tier after RAM and disk: a Redis that replicas on other machines share "
        "(redis://HOST:PORT/DB, rediss://..., unix:///PATH); none = no remote tier",
    )
    parser.add_argument(
        "--kv-remote-password-env",
        default=None,
        metavar="NAME",
        help="environment variable holding the remote tier's Redis password (never a flag value)",
    )
    parser.add_argument("--kv-remote-prefix", default="kvgate", help="key prefix in the remote tier's Redis")
    parser.add_argument(
        "--kv-remote-timeout",
        type=float,
        default=2.0,
        help="seconds one remote round trip may take before Redis counts as down (misses, backoff)",
    )
    parser.add_argument(
        "--kv-remote-ttl",
        type=int,
        default=0,
        help="expiry of remote chunks in seconds, refreshed on every hit (0 = none: maxmemory's LRU)",
    )
    parser.add_argument("--chunk-tokens", type=int, default=256, help="tokens per stored KV chunk (= event block_size)")
    parser.add_argument(
        "--events-endpoint",
        default=None,
        metavar="tcp://127.0.0.1:PORT",
        help="publish KV events (vLLM format, ZMQ PUB bound here)",
    )
    parser.add_argument(
        "--exact-prefill",
        action="store_true",
        help="prefill in chunk-sized slices: KV loaded from the store then gives bit-identical logits "
        "to a cold run (cold prefill ~25%% slower)",
    )
    parser.add_argument(
        "--max-running",
        type=int,
        default=MAX_RUNNING,
        help="requests started at once, interleaved step by step (each holds its KV in RAM)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])


def build_store(kv_dir: Path | None, ram_mb: int, disk_mb: int, namespace: str, remote: Any = None) -> Any:
    """A ChunkStore over a RAM tier, a disk tier (with --kv-dir) and a remote tier (RedisTier), in
    that order, each where its budget / option allows; None when it would have no tier but RAM
    (no --kv-dir and no --kv-remote) or none at all."""
    from kvgate.index.kv.chunks import ChunkStore, DiskTier, MemoryTier

    if ram_mb < 0 or disk_mb < 0:
        raise ValueError("--kv-ram-mb and --kv-disk-mb must be >= 0")
    if kv_dir is None and remote is None:
        return None
    tiers: list[Any] = []
    if ram_mb:
        tiers.append(MemoryTier(ram_mb << 20))
    if disk_mb and kv_dir is not None:
        tiers.append(DiskTier(kv_dir, disk_mb << 20))
    if remote is not None:
        tiers.append(remote)
    return ChunkStore(tiers, namespace=namespace) if tiers else None


def remote_tier(args: argparse.Namespace) -> Any:
    """The RedisTier of --kv-remote (None without it); ValueError naming the flag on bad values.
    Redis need not be up: an unreachable one costs misses until it answers."""
    if not args.kv_remote:
        return None
    from kvgate.index.kv.chunks.redis import RedisTier
    from kvgate.index.storage.env import secret_from_env

    password = secret_from_env(args.kv_remote_password_env, "--kv-remote-password-env")  # MissingSecret: a ValueError
    if args.kv_remote_ttl < 0:
        raise ValueError("--kv-remote-ttl must be >= 0")
    try:
        return RedisTier(
            args.kv_remote,
            prefix=args.kv_remote_prefix,
            password=password,
            timeout_s=args.kv_remote_timeout,
            ttl_s=args.kv_remote_ttl or None,
        )
    except ValueError as exc:
        raise ValueError(f"--kv-remote {args.kv_remote!r} (or its options): {exc}") from None


def run(args: argparse.Namespace) -> int:
    """Load the model, serve until interrupted; 2 on bad options."""
    import torch
    import uvicorn

    from kvgate.engines.replica.engine import ReplicaEngine
    from kvgate.engines.replica.model import load_model, model_namespace
    from kvgate.index.kv.chunks.allocator import keep_freed_memory

    if args.chunk_tokens <= 0:
        print("kvgate replica: error: --chunk-tokens must be positive", file=sys.stderr)
        return 2
    if args.max_running < 1:
        print("kvgate replica: error: --max-running must be >= 1", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    keep_freed_memory()  # chunk buffers reused, not faulted back in page by page (kvgate.index.kv.chunks.allocator)
    publisher = store = engine = None
    try:
        remote = remote_tier(args)  # bad --kv-remote values stop start-up before the model loads
        model, tokenizer = load_model(args.model, dtype=getattr(torch, args.dtype))
        store = build_store(args.kv_dir, args.kv_ram_mb, args.kv_disk_mb, model_namespace(model), remote)
        callbacks: dict[str, Any] = {}
        if args.events_endpoint:
            import zmq

            from kvgate.index.kv.kv_events import MEDIUM_CPU, ZmqEventPublisher

            try:
                publisher = ZmqEventPublisher(args.events_endpoint)
            except zmq.ZMQError as exc:
                raise ValueError(f"--events-endpoint {args.events_endpoint}: {exc}") from None
            cb = publisher_callbacks(publisher, args.chunk_tokens, medium=MEDIUM_CPU)
            callbacks = {"on_stored": cb["on_stored"], "on_removed": cb["on_removed"]}
        engine = ReplicaEngine(
            model,
            tokenizer,
            store,
            chunk_tokens=args.chunk_tokens,
            tail_bytes=args.kv_tail_mb << 20,
            exact_prefill=args.exact_prefill,
            max_running=args.max_running,
            **callbacks,
        )
        engine.generate([{"role": "user", "content": "hi"}], max_tokens=1)  # warm-up: first forward is slow
    except (ValueError, FileNotFoundError) as exc:
        print(f"kvgate replica: error: {exc}", file=sys.stderr)
        for closable in (engine, store, publisher):
            if closable is not None:
                closable.close()
        return 2
    name = args.name or f"replica-{args.port}"
    kv = (
        f"KV store {args.kv_dir} (RAM {args.kv_ram_mb} MiB, disk {args.kv_disk_mb} MiB"
        + (f", remote Redis prefix {args.kv_remote_prefix!r}" if args.kv_remote else "")
        + f", chunks of {args.chunk_tokens} tokens)"
        if store is not None
        else "no KV store"
    )
    events = f", KV events on {publisher.endpoint}" if publisher is not None else ""
    print(f"kvgate replica {name} on http://{args.host}:{args.port}/v1: {engine.namespace}, {kv}{events}", flush=True)
    try:
        uvicorn.run(
            create_replica_app(engine, name, args.model if args.model == "smollm2" else Path(args.model).name),
            host=args.host,
            port=args.port,
            log_level=args.log_level,
        )
    finally:
        engine.close()
        if store is not None:
            store.close()
        if publisher is not None:
            publisher.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvgate replica", description="a CPU model replica with a KV chunk store")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    # `python -m kvgate.engines.replica.server` owns its process: the same defaults `kvgate replica` sets
    # (middleware/cli.py), before the model loads
    from kvgate.index.storage.env import offline_defaults

    os.environ.update(offline_defaults(os.environ))
    sys.exit(main())
