"""The processes of `kvgate bench vllm` (tools/bench/vllm_arena.py) other than the vLLM servers:
what must be installed, each kvgate arm's config, waiting for an anchor's workers, a fresh
router's warm-up, the other vLLM servers sharing the machine's cores, and Ctrl-C held while the
servers start."""

from __future__ import annotations

import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import httpx

from kvgate.engines.vllm.launch import VllmServer, default_model_dir, vllm_available, vllm_python
from kvgate.tools.bench.procs import kvgate_argv, sglang_router_bin, vllm_router_bin
from kvgate.tools.bench.vllm_arena_client import Turn, send_turn
from kvgate.tools.bench.vllm_arena_workload import next_prompt

MODEL = "smollm2"  # the servers' --served-model-name
ANCHOR_OF = {"sglang": "sglang", "vllm_router": "vllm_router"}  # arm -> arena_routers.anchor_launch name


def preflight(arms: Sequence[str], trace: Path) -> list[str]:
    """What is missing to run these arms, as messages."""
    bad = []
    if not vllm_available():
        bad.append(f"vLLM's environment is missing ({vllm_python()}): run `make install` (or set KVGATE_VLLM_PYTHON)")
    if not (default_model_dir() / "config.json").exists():
        bad.append(f"no SmolLM2 model dir at {default_model_dir()}: run `kvgate prepare`")
    for arm, find, name in (
        ("sglang", sglang_router_bin, "sglang-router"),
        ("vllm_router", vllm_router_bin, "vllm-router"),
    ):
        if arm in arms and find() is None:
            bad.append(
                f"{name} is not installed beside {sys.executable} (a dev dependency: `pip install -e '.[dev]'`); "
                f"install it or leave {arm} out of --arms"
            )
    if not trace.exists():
        bad.append(f"no trace at {trace} (--trace)")
    return bad


# kvgate's prefix-aware arms: (routing.prefix.mode, routing.policy)
KVGATE_ARMS = {
    "kvgate_precise": ("precise", "cache_aware"),
    "kvgate_approximate": ("approximate", "cache_aware"),
    "kvgate_precise_prefill_time": ("precise", "prefill_time"),
    "kvgate_approximate_prefill_time": ("approximate", "prefill_time"),
    "kvgate_precise_resident": ("precise", "cache_aware"),
    "kvgate_precise_unpolled": ("precise", "cache_aware"),
    "kvgate_precise_polled": ("precise", "cache_aware"),
    "kvgate_precise_w2": ("precise", "cache_aware"),
    "kvgate_precise_decode": ("precise", "cache_aware"),
    "kvgate_precise_stall": ("precise", "cache_aware"),
    "kvgate_approximate_stall": ("approximate", "cache_aware"),
}
# an arm's policy knobs beside the defaults
KVGATE_ARM_KNOBS = {
    "kvgate_precise_resident": {"new_sessions": "resident"},
    # a running request counted as the prefill its remaining decode is worth on the CPU engines
    # (its remaining tokens × a decode step's time × the prefill rate), set before any run: a start
    # then avoids the engine whose decodes it would slow, where the default counts them as 8 tokens
    "kvgate_precise_decode": {"decode_weight": 1024},
    # the running decodes' wait for this request's prefill counted in full (cache_aware's stall charge)
    "kvgate_precise_stall": {"stall_weight": 1.0},
    "kvgate_approximate_stall": {"stall_weight": 1.0},
}
# `stats.scrape_replicas` of the arms that set it: none read (the dashboard's engine numbers off;
# cache_aware reads none itself) or every interval whether watched or not, to see what the reads
# cost the engines
SCRAPE_OF_ARM = {"kvgate_precise_unpolled": "never", "kvgate_precise_polled": "always"}
# `kvgate serve --workers N` of the arms that run more than one proxy process, to see whether more
# event loops wait less for a core beside the engines
WORKERS_OF_ARM = {"kvgate_precise_w2": 2}


# the ablation arm: the turns sent straight to the engines kvgate precise chose for them in the same
# run (no router process, nothing hashed), so kvgate's placement is measured without its proxy
REPLAY_ARM = "replay_precise"
REPLAYED = "kvgate_precise"


def placements(records: Sequence[dict[str, Any]]) -> dict[tuple[int, int], str]:
    """(conversation, turn) → the replica a kvgate run named for it, from its request_records."""
    return {(r["c"], r["t"]): r["replica"] for r in records if "replica" in r}


def kvgate_config(arm: str, servers: Sequence[VllmServer], cache_dir: Path, tokenizer: str) -> dict[str, Any]:
    """`kvgate serve` config of a kvgate arm: both cache tiers off, the two servers as replicas."""
    replicas: list[dict[str, Any]] = [{"name": f"v{i}", "api_base": s.api_base} for i, s in enumerate(servers)]
    if arm in KVGATE_ARMS:
        mode, policy = KVGATE_ARMS[arm]
        knobs = KVGATE_ARM_KNOBS.get(arm)
        routing: dict[str, Any] = {"policy": {"name": policy, **knobs} if knobs else policy, "prefix": {"mode": mode}}
        if mode == "precise":
            for r, s in zip(replicas, servers):
                r["events"] = s.events
        else:
            routing["prefix"]["tokenizer"] = tokenizer
    else:
        routing = {"policy": "round_robin"}
    return {
        "cache_dir": str(cache_dir),
        **({"stats": {"scrape_replicas": SCRAPE_OF_ARM[arm]}} if arm in SCRAPE_OF_ARM else {}),
        "server": {"timing_header": True},  # each turn's steps through the proxy (request_records' proxy_ms)
        "routes": [
            {
                "name": "vllm",
                "model": "*",
                "backend": {"model": f"openai/{MODEL}", "api_key": "none", "timeout": 600},
                "exact": False,
                "semantic": {"enabled": False},
                "replicas": replicas,
                "routing": routing,
            }
        ],
    }


def serve_argv(arm: str, config: Path, port: int) -> list[str]:
    """The command line of a kvgate arm's proxy: `kvgate serve` on `config`, `--workers` as the arm runs it."""
    return kvgate_argv(
        "serve",
        *("--config", str(config), "--port", str(port), "--log-level", "warning"),
        *("--workers", str(WORKERS_OF_ARM.get(arm, 1))),
    )


def wait_workers(url: str, n: int, timeout: float = 120.0) -> None:
    """Until an anchor's GET /readiness counts `n` healthy workers (sglang-router and vllm-router both serve it)."""
    deadline, seen = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            seen = httpx.get(url, timeout=5).json()
            if seen.get("healthy_workers", 0) >= n:
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url}: not {n} healthy workers within {timeout:.0f}s (last answer {seen})")


async def warm_up(url: str, n: int = 2, endpoint: str = "chat") -> None:
    """First-call costs of a fresh router (connections, lazy imports) before the measured run, on
    the endpoint the run uses."""
    from kvgate.middleware.forward.http1 import Pool

    client = Pool(keepalive_s=3.0)
    try:
        for i in range(n):
            text = f"warm-up {i}"
            prompt = next_prompt("", "", text) if endpoint == "completions" else None
            turn = Turn(-1, i, [{"role": "user", "content": text}], prompt)
            await send_turn(client, url, turn, MODEL, 2, 120.0)
            if turn.error:
                raise RuntimeError(f"warm-up through {url} failed: {turn.error}")
    finally:
        await client.aclose()


def other_vllm_servers(ours: Sequence[int] = ()) -> int:
    """vLLM API servers running on this machine but for the processes `ours` (they share the cores)."""
    n = 0
    for entry in Path("/proc").iterdir():
        if entry.name in {str(pid) for pid in ours}:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        n += (
            bool(argv)
            and Path(argv[0].decode(errors="replace")).name.startswith("python")
            and b"vllm.entrypoints.openai.api_server" in argv
        )
    return n


@contextmanager
def signals_deferred(log: Callable[[str], None]) -> Iterator[None]:
    """SIGINT and SIGTERM held until the block ends, then raised as KeyboardInterrupt: a pair of
    servers half-started by kvgate.engines.vllm.launch.start_pair cannot be stopped by its caller (it
    has no handle on them yet), so an interrupt waits until they are up and can be."""
    got: list[int] = []

    def hold(signum: int, frame: object) -> None:
        if not got:
            log("interrupted: stopping as soon as the vLLM servers are up")
        got.append(signum)

    old = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if got:
        raise KeyboardInterrupt
