"""`kvgate bench route-overhead`: how long one routing decision takes.

A decision = render + tokenize the prompt (reusing earlier turns), chain-hash its blocks, match
them against the prefix index, and let the policy choose. Measured for a ~8k-token, 20-turn
conversation with 8 replicas and 1M indexed blocks: each sample adds a new user turn to the same
history (the multi-turn case the incremental hasher is built for); the cold figure is the first
sight of a whole history.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from kvgate.index.kv.hashing import block_hashes
from kvgate.middleware.config import PrefixConfig, ReplicaConfig, RoutingConfig
from kvgate.middleware.routing.router import Router
from kvgate.tools.bench.stats import pct, write_json

WORDS = (
    "the of and to in a is that for it as was with be by on not this are or from at which but have an they "
    "you were her she there would their we him been has when who will more no if out so said what up its about "
    "into than them can only other new some could time these two may then do first any my now such like our "
    "over man me even most made after also did many before must through back years where much your way well"
).split()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--indexed-blocks", type=int, default=1_000_000, help="blocks held across all replicas")
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--tokens", type=int, default=8000, help="approximate prompt length")
    p.add_argument("--tokenizer", default="smollm2")
    p.add_argument("--policy", default="cache_aware")
    p.add_argument("--samples", type=int, default=500)
    p.add_argument("--json", type=Path, default=None)


def conversation(turns: int, tokens: int, rng: random.Random) -> list[dict[str, str]]:
    words_per_turn = max(1, tokens // turns)  # these common words are ~1 token each
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    for t in range(turns):
        role = "user" if t % 2 == 0 else "assistant"
        msgs.append({"role": role, "content": " ".join(rng.choices(WORDS, k=words_per_turn))})
    if msgs[-1]["role"] != "user":
        msgs.append({"role": "user", "content": "and then?"})
    return msgs


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(7)
    cfg = RoutingConfig(policy=args.policy, prefix=PrefixConfig(tokenizer=args.tokenizer, block_size=16))
    replicas = [ReplicaConfig(name=f"r{i}", api_base=f"http://127.0.0.1:{9100 + i}/v1") for i in range(args.replicas)]
    router = Router(replicas, cfg)
    history = conversation(args.turns, args.tokens, rng)
    hashes, n_tokens = router.hasher.hashes(history)
    print(f"prompt: {n_tokens} tokens, {len(hashes)} blocks, {len(history)} messages", file=sys.stderr)

    started = time.time()
    per_replica = args.indexed_blocks // args.replicas
    for i, r in enumerate(replicas):
        # each replica holds chains of unrelated prompts; r0 also holds this conversation's prefix
        chains: list[int] = []
        while len(chains) < per_replica:
            chains += block_hashes([rng.randrange(49152) for _ in range(16 * 256)], 16, extra=(r.name, len(chains)))
        if i == 0:
            chains = hashes[: len(hashes) * 3 // 4] + chains
        router.index.stored(r.name, chains[:per_replica])
    print(
        f"indexed {sum(router.index.blocks(r.name) for r in replicas)} blocks in {time.time() - started:.1f}s",
        file=sys.stderr,
    )

    def decide(messages: list[dict[str, str]]) -> tuple[float, str]:
        t0 = time.perf_counter()
        plan = router.plan(messages)
        choice = router.choose(plan)
        return time.perf_counter() - t0, choice.name if choice else "-"

    cold_router = Router(replicas, cfg, index=router.index)
    t0 = time.perf_counter()
    cold_router.choose(cold_router.plan(history))
    cold = time.perf_counter() - t0

    times, chosen = [], []
    for s in range(args.samples):
        msgs = history + [
            {"role": "assistant", "content": "Sure."},
            {"role": "user", "content": f"Follow-up question {s}: " + " ".join(rng.choices(WORDS, k=20))},
        ]
        dt, name = decide(msgs)
        times.append(dt)
        chosen.append(name)
    return {
        "prompt_tokens": n_tokens,
        "blocks": len(hashes),
        "messages": len(history) + 2,
        "replicas": args.replicas,
        "indexed_blocks": sum(router.index.blocks(r.name) for r in replicas),
        "policy": args.policy,
        "tokenizer": args.tokenizer,
        "samples": args.samples,
        "decision_p50_ms": statistics.median(times) * 1000,
        "decision_p99_ms": pct(times, 0.99) * 1000,
        "decision_mean_ms": statistics.fmean(times) * 1000,
        "cold_decision_ms": cold * 1000,
        "chose_prefix_holder_fraction": chosen.count("r0") / len(chosen),
        "machine": {
            "cpus": __import__("os").cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
    }


def main(args: argparse.Namespace) -> int:
    result = run(args)
    print(
        f"routing decision ({result['prompt_tokens']} tokens, {result['replicas']} replicas, {result['indexed_blocks']} blocks): "
        f"p50 {result['decision_p50_ms']:.3f} ms, p99 {result['decision_p99_ms']:.3f} ms, cold {result['cold_decision_ms']:.1f} ms"
    )
    write_json(args.json, result)
    return 0
