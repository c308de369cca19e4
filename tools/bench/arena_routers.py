"""The routers of the routing arena (`tools/bench/arena.py`): how each is started, with what it
is told, and the parameters tuned for it.

- kvgate policies run as `kvgate serve` with both cache tiers off (every request is routed),
  tokenizer `text`, approximate mode at its defaults (blocks of 64 characters since 2026-11-23,
  16 before; precise mode: the replicas' 16), `record_answers` at its default. What it
  knows of the replicas' cache size is the arena's capacity hint, nothing else:
  `none` → `capacity_blocks` unset (the default bound, 262,144 blocks); `reported` → the size each replica
  reports in its /stats (in our blocks), the same number the anchors get as `--max-tree-size`.
- Anchors: sglang-router (`launch --policy cache_aware`) and vllm-router (`--policy
  cache_aware`, its prefix/cache-aware policy): both keep an approximate radix tree per worker
  and route to the longest match above `cache_threshold` unless the load (requests in flight) is
  imbalanced beyond `balance_abs_threshold` and `balance_rel_threshold`; below the threshold
  sglang picks the worker with the smallest tree, vllm-router the least loaded. sglang's tree
  holds request text; vllm-router's holds token ids, which it asks a worker for
  (`POST /v1/chat/completions/render`, as vLLM serves it; the sim replicas answer it — without
  it vllm-router falls back to least-loaded routing). The three thresholds are what the arena
  tunes for them (ANCHOR_GRID), on the tuning slice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvgate.tools.bench.procs import free_port, sglang_router_bin, vllm_router_bin

BLOCK_SIZE = 16
KVGATE_POLICIES = ("round_robin", "least_loaded", "cache_aware", "cache_aware_precise", "affinity")
ANCHORS = ("sglang", "vllm_router")
ANCHOR_DEFAULTS = {"cache_threshold": 0.3, "balance_abs_threshold": 64, "balance_rel_threshold": 1.5}
# threshold candidates tried on the tuning slice: defaults, then ever more eager load balancing
ANCHOR_GRID = "0.3/64/1.5,0.3/16/1.5,0.5/8/1.25"
HINT_EVICTION_S = 5  # with a capacity hint the anchors' trees are trimmed this often (defaults 60/120 s)


@dataclass(frozen=True)
class Launch:
    """A router process to start: argv (None for a kvgate config), its readiness URL path, label."""

    argv: list[str] | None
    label: str
    config: dict[str, Any] | None = None


def parse_grid(text: str) -> list[dict[str, float]]:
    """ "ct/abs/rel,..." → threshold dicts (ValueError on a malformed entry)."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        parts = item.split("/")
        if len(parts) != 3:
            raise ValueError(f"anchor grid entry {item!r}: want cache_threshold/balance_abs/balance_rel")
        ct, ab, rel = float(parts[0]), int(parts[1]), float(parts[2])
        out.append({"cache_threshold": ct, "balance_abs_threshold": ab, "balance_rel_threshold": rel})
    return out


def anchor_launch(
    name: str, port: int, urls: list[str], params: dict[str, float], tree_chars: int | None
) -> Launch | None:
    """argv of an anchor router (None when it is not installed). tree_chars: the capacity hint
    per worker (characters = tokens with the text tokenizer), or None for the router's default."""
    binary = sglang_router_bin() if name == "sglang" else vllm_router_bin()
    if binary is None:
        return None
    head = [binary, "launch"] if name == "sglang" else [binary]
    argv = [
        *head,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *urls,
        "--policy",
        "cache_aware",
        "--cache-threshold",
        str(params["cache_threshold"]),
        "--balance-abs-threshold",
        str(int(params["balance_abs_threshold"])),
        "--balance-rel-threshold",
        str(params["balance_rel_threshold"]),
        "--request-timeout-secs",
        "600",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),
        "--log-level",
        "warn" if name == "sglang" else "warning",
    ]
    if tree_chars is not None:
        argv += ["--max-tree-size", str(tree_chars), "--eviction-interval-secs", str(HINT_EVICTION_S)]
    thresholds = "/".join(str(params[k]) for k in ANCHOR_DEFAULTS)
    label = f"{'sglang-router' if name == 'sglang' else 'vllm-router'} --policy cache_aware (ct/abs/rel {thresholds})"
    return Launch(argv=argv, label=label)


def kvgate_config(
    policy: str,
    replicas: list[str],
    cache_dir: str,
    events: list[str] | None = None,
    capacity_blocks: int | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`kvgate serve` config for one policy: both cache tiers off; approximate mode told only the
    capacity hint (None: capacity_blocks unset); `cache_aware_precise` follows KV events. `extra`:
    flat routing options (`--routing`, `--kvgate-grid`), each put in its block: a policy knob into
    routing.policy when it is this policy's (dropped for the others), a prefix field into
    routing.prefix, anything else on routing itself."""
    from kvgate.middleware.config import PrefixConfig
    from kvgate.middleware.routing_config import KNOB_POLICY, PREFIX_FIELDS

    precise = policy == "cache_aware_precise"
    name = "cache_aware" if precise else policy
    knobs: dict[str, Any] = {"name": name}
    prefix: dict[str, Any] = {
        "tokenizer": "codepoints" if precise else "text",
        "mode": "precise" if precise else "approximate",
    }
    routing: dict[str, Any] = {"policy": knobs, "prefix": prefix, "max_attempts": 2}
    if precise:  # the replicas' blocks; approximate mode keeps its own default (64 characters with text)
        prefix["block_size"] = BLOCK_SIZE
    if capacity_blocks is not None and not precise:  # the hint is in the replicas' blocks: the same tokens in ours
        prefix["capacity_blocks"] = max(1, capacity_blocks * BLOCK_SIZE // PrefixConfig(tokenizer="text").block_size)
    for key, value in (extra or {}).items():
        if key in KNOB_POLICY:
            if KNOB_POLICY[key] == name:
                knobs[key] = value
        else:
            (prefix if key in PREFIX_FIELDS else routing)[key] = value
    replica_cfg = [{"name": f"r{i}", "api_base": f"{u}/v1"} for i, u in enumerate(replicas)]
    if precise:
        for r, e in zip(replica_cfg, events or []):
            r["events"] = e
    return {
        "cache_dir": cache_dir,
        "routes": [
            {
                "name": "arena",
                "model": "*",
                "backend": {"model": "openai/sim", "api_key": "none", "timeout": 600},
                "exact": False,
                "semantic": {"enabled": False},  # every request must be routed
                "replicas": replica_cfg,
                "routing": routing,
            }
        ],
        "server": {"max_body_bytes": 64 * 1024 * 1024},
    }
