"""`kvgate` command line: serve | prepare | check-config | bench ..."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import middleware  # noqa: F401  (sets offline env defaults before heavy imports)
from middleware.errors import ConfigError


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from middleware.auth import bind_warning
    from middleware.config import load_config
    from middleware.proxy import create_app

    config = load_config(args.config)
    import litellm

    # The proxy owns this process and uses no LiteLLM loggers: skip its per-chunk logging work
    # (~30% of the proxy's CPU per streamed request).
    litellm.disable_streaming_logging = True
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    warning = bind_warning(host, config.auth.keys)
    if warning:
        logging.getLogger("kvgate").warning(warning)
    print(f"kvgate: serving {len(config.routes)} route(s) on http://{host}:{port}/v1 (cache: {config.cache_dir})\n"
          f"  try: curl -s http://{host}:{port}/v1/chat/completions -H 'content-type: application/json' "
          f"-d '{{\"model\": \"{config.routes[0].model.replace('*', '1')}\", \"messages\": [{{\"role\": \"user\", \"content\": \"What is the capital of France?\"}}]}}' -i", flush=True)
    # Idle client connections stay open longer than clients keep them (httpx, the OpenAI SDK: 5 s),
    # so the proxy never closes one a client is about to reuse (uvicorn's own default is 5 s too).
    uvicorn.run(create_app(config), host=host, port=port, log_level=args.log_level, access_log=args.access_log,
                timeout_keep_alive=config.server.keep_alive_s)
    return 0


def _check(args: argparse.Namespace) -> int:
    from middleware.config import load_config

    from middleware.verification import resolve

    config = load_config(args.config)
    for position, route in enumerate(config.routes):
        sem = route.semantic
        # with target_precision the thresholds come from `kvgate tune` (a missing point is a ConfigError here too)
        settings = resolve(route, config.cache_dir, position)
        verifier = f" verifier ≥ {settings.verifier_threshold:.4f} (top-{settings.candidates})" if settings.verifies else ""
        target = f" target_precision {sem.target_precision}" if sem.target_precision is not None else ""
        print(f"route {route.name}: model {route.model!r} → {route.backend.model or '(request model)'}"
              f"{target} threshold {settings.threshold}{verifier} scope {sem.scope} context {sem.context}")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from index.embedder import make_embedder

    embedder = make_embedder("onnx", cache_dir=args.model_cache)
    vec = embedder.embed(["kvgate prepare"])
    print(f"embedder ready: {embedder.name} dim={vec.shape[1]} at {getattr(embedder, 'path', '?')}")
    from index.tokenizer import load_tokenizer, smollm2_tokenizer_dir

    tok = load_tokenizer("smollm2")
    ids = tok.encode("".join(tok.segments([{"role": "user", "content": "hi"}])))
    print(f"smollm2 tokenizer ready at {smollm2_tokenizer_dir()} ({len(ids)} tokens for a one-word chat)")
    from middleware.replica.model import convert_smollm2

    print(f"smollm2 model ready at {convert_smollm2()} (safetensors, converted once from the packaged GGUF)")
    return 0


def _demo_backend(args: argparse.Namespace) -> int:
    import uvicorn

    from middleware.bench.fake_backend import create_fake_app

    print(f"kvgate demo backend (echoes 'Answer <n>: <question>') on http://{args.host}:{args.port}/v1", flush=True)
    # keeps idle connections longer than the proxy's pool does (AIOHTTP_KEEPALIVE_TIMEOUT, 3 s)
    uvicorn.run(create_fake_app(), host=args.host, port=args.port, log_level="warning", timeout_keep_alive=75)
    return 0


# `kvgate bench NAME` → the module under middleware/bench that runs it (imported on use: each
# pulls in heavy dependencies of its own)
BENCH_MODULES = {
    "semantic": "semantic", "routing": "arena", "kv": "kv", "e2e": "e2e", "storage-faults": "storage_faults",
    "replica-faults": "replica_faults", "multiturn": "multiturn", "soak": "soak", "route-overhead": "route_overhead",
}


def _bench(args: argparse.Namespace) -> int:
    import importlib

    name = BENCH_MODULES.get(args.bench)
    if name is None:
        return 2
    return int(importlib.import_module(f"middleware.bench.{name}").main(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgate", description="LLM caching middleware: semantic response cache in front of LiteLLM.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the OpenAI-compatible proxy")
    serve.add_argument("--config", required=True, type=Path, help="YAML config file")
    serve.add_argument("--host", default=None, help="bind address (default: server.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default: server.port, 8080)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--access-log", action="store_true", help="log every request line")
    serve.set_defaults(func=_serve)

    check = sub.add_parser("check-config", help="validate a config file and print its routes")
    check.add_argument("--config", required=True, type=Path)
    check.set_defaults(func=_check)

    prep = sub.add_parser("prepare", help="export the embedder to ONNX, convert SmolLM2's tokenizer and weights (make install)")
    prep.add_argument("--model-cache", default=None, help="where exported models go (default ~/.cache/kvgate/models)")
    prep.set_defaults(func=_prepare)

    from middleware.tuning import tune

    tune.add_arguments(sub.add_parser(
        "tune", help="train/load the verifier and calibrate a route's operating point for a precision target",
        description="Train (or load) the verifier, pick the cosine + verifier thresholds that meet the target "
                    "precision with the best recall on the calibration part of --pairs, and write them to "
                    "<cache_dir>/tuned/<route>.json for routes with semantic.target_precision. Progress on stderr."))
    sub.choices["tune"].set_defaults(func=tune.main)

    demo = sub.add_parser("demo-backend", help="a deterministic fake OpenAI-compatible backend for demos and tests")
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--port", type=int, default=9001)
    demo.set_defaults(func=_demo_backend)

    from middleware.replica import sim

    sim.add_arguments(sub.add_parser("sim-replica", help="a simulated engine replica (prefix cache + timing model)"))
    sub.choices["sim-replica"].set_defaults(func=sim.run)
    from middleware.replica import server as replica

    replica.add_arguments(sub.add_parser("replica", help="the reference CPU replica: SmolLM2-135M + KV chunk store (RAM/disk)"))
    sub.choices["replica"].set_defaults(func=replica.run)

    bench = sub.add_parser("bench", help="benchmarks (results as JSON)")
    bsub = bench.add_subparsers(dest="bench", required=True)
    from middleware.bench.semantic import add_arguments

    add_arguments(bsub.add_parser("semantic", help="semantic cache precision/recall and lookup latency, vs GPTCache"))
    from middleware.bench import route_overhead

    route_overhead.add_arguments(bsub.add_parser("route-overhead", help="routing decision time (tokenize+hash+match+choose)"))
    from middleware.bench import soak

    soak.add_arguments(bsub.add_parser("soak", help="bounded load through kvgate serve: errors, RSS, fds, cache budget"))
    from middleware.bench import arena

    arena.add_arguments(bsub.add_parser("routing", help="the routing arena: policies vs sglang-router on a replayed trace"))
    from middleware.bench import e2e, kv

    kv.add_arguments(bsub.add_parser("kv", help="KV chunk store: TTFT cold vs warm RAM vs warm disk, chunk load GB/s"))
    e2e.add_arguments(bsub.add_parser("e2e", help="multi-turn chats through kvgate serve over reference replicas, per policy"))
    from middleware.bench import multiturn

    multiturn.add_arguments(bsub.add_parser("multiturn", help="follow-ups vs other conversations' answers; feedback on wrong hits"))
    from middleware.bench import replica_faults

    replica_faults.add_arguments(bsub.add_parser("replica-faults", help="kill / slow / hang one of N replicas under load through the proxy"))
    from middleware.bench import storage_faults

    storage_faults.add_arguments(bsub.add_parser("storage-faults", help="SIGKILL proxy + disk-tier writer during writes; a full disk"))
    bench.set_defaults(func=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx"):  # per-call INFO lines from libraries
        logging.getLogger(noisy).setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"kvgate: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
