"""`kvgate bench gen-trace`: a seeded long-prompt trace in Mooncake format.

Each line is {timestamp (ms), input_length, output_length (tokens), hash_ids (one id per
`block_tokens` prompt tokens)}, the format `tools/bench/trace.py` reads, so the arena replays it
like the conversation trace.

The workload: multi-turn sessions over long contexts (documents, code, tool output), the kind of
traffic where prefill dominates and a router's queueing decisions decide the tail.
- Sessions arrive as a Poisson process. A session opens with one of `system_prompts` shared
  system prefixes (whole blocks, so every session that uses it shares those exact blocks), then
  its own context (heavy-tailed: lognormal, cut to [1 block, max_tokens]) and a first question.
- A session has 1 + Geometric(turn_p) turns. Turn k+1's prompt is turn k's prompt + that turn's
  answer + a new question, so its hash ids extend turn k's: a partial last block keeps its id
  and grows (its text is a deterministic function of the id, cut to the length), so turn k's
  prompt text is an exact prefix of turn k+1's. Turns follow after an exponential think time.
- Lengths are in tokens; with the arena's text tokenizer one token is one character.

Shape with the defaults (checked by tests/test_bench_routing.py on 2,000 requests): mean prompt
~15k tokens, median ~11.6k, a handful past 100k, none past max_tokens (190k). Same arguments →
the same trace, byte for byte (one random.Random(seed), no other state).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TraceShape:
    """The generator's knobs (lengths in tokens, times in seconds)."""

    requests: int = 4000
    seed: int = 0
    rate: float = 4.5  # mean requests per second over the trace (session starts × mean turns)
    block_tokens: int = 512
    system_prompts: int = 8
    system_blocks: tuple[int, int] = (2, 8)  # each system prefix: uniform whole blocks in [lo, hi]
    context_median: float = 7800.0  # a session's own context: lognormal median
    context_sigma: float = 0.95
    question_median: float = 300.0  # a new user turn: lognormal median
    question_sigma: float = 0.8
    output_median: float = 250.0
    output_sigma: float = 0.6
    turn_p: float = 0.45  # P(a session ends after each turn): mean turns 1/turn_p
    think_s: float = 40.0  # mean pause between a session's turns
    max_tokens: int = 190_000


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(median * math.exp(sigma * rng.gauss(0.0, 1.0))))))


class _Ids:
    """Fresh hash ids, counted up from 1 (deterministic, shared by the whole trace)."""

    def __init__(self) -> None:
        self.next = 1

    def take(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def _extend(ids: list[int], length: int, add: int, block: int, fresh: _Ids) -> int:
    """Append `add` tokens to a prompt of `length` tokens whose blocks are `ids` (in place): a
    partial last block keeps its id, new blocks get fresh ids. Returns the new length."""
    new_len = length + add
    need = -(-new_len // block)
    ids.extend(fresh.take(max(0, need - len(ids))))
    return new_len


def generate(shape: TraceShape = TraceShape()) -> list[dict[str, Any]]:
    """The trace: `shape.requests` rows sorted by timestamp (ms, first at 0).

    Invariants: len(hash_ids) == ceil(input_length / block_tokens); a session's turn k+1 hash_ids
    start with turn k's; input_length <= max_tokens; rows of one session are in time order; ids
    up to system_prompts · system_blocks[1] belong to system prefixes, later ids to one session."""
    rng = random.Random(shape.seed)
    fresh = _Ids()
    block = shape.block_tokens
    systems = [fresh.take(rng.randint(*shape.system_blocks)) for _ in range(shape.system_prompts)]
    fresh.next = shape.system_prompts * shape.system_blocks[1] + 1  # ids up to here: system prefixes only
    mean_turns = 1.0 / shape.turn_p
    session_gap = mean_turns / shape.rate  # seconds between session starts
    # (time, tie, session state) of each session's next turn, popped in time order
    pending: list[tuple[float, int, dict[str, Any]]] = []
    rows: list[dict[str, Any]] = []
    t_next_session, tie = 0.0, 0
    while len(rows) < shape.requests:
        if not pending or t_next_session <= pending[0][0]:
            sys_ids = systems[rng.randrange(len(systems))]
            ids = list(sys_ids)
            length = len(sys_ids) * block
            ctx = _lognormal(rng, shape.context_median, shape.context_sigma, block, shape.max_tokens)
            length = _extend(ids, length, ctx, block, fresh)  # system prefix is whole blocks: context starts a new one
            state = {"ids": ids, "length": length, "answer": 0}
            heapq.heappush(pending, (t_next_session, tie, state))
            tie += 1
            t_next_session += rng.expovariate(1.0 / session_gap)
            continue
        t, _, state = heapq.heappop(pending)
        add = state["answer"] + _lognormal(rng, shape.question_median, shape.question_sigma, 1, shape.max_tokens)
        if state["length"] + add > shape.max_tokens:
            continue  # the session has outgrown the context window: it ends
        state["length"] = _extend(state["ids"], state["length"], add, block, fresh)
        out = _lognormal(rng, shape.output_median, shape.output_sigma, 1, 8192)
        rows.append(
            {
                "timestamp": round(t * 1000),
                "input_length": state["length"],
                "output_length": out,
                "hash_ids": list(state["ids"]),
            }
        )
        state["answer"] = out
        if rng.random() >= shape.turn_p:
            heapq.heappush(pending, (t + rng.expovariate(1.0 / shape.think_s), tie, state))
            tie += 1
    return sorted(rows, key=lambda r: r["timestamp"])


def write_trace(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")


def describe(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Prompt-length summary: mean, median, p99, max, requests, span (s)."""
    lengths = sorted(r["input_length"] for r in rows)
    n = len(lengths)
    return {
        "requests": n,
        "mean": sum(lengths) / n,
        "median": lengths[n // 2],
        "p99": lengths[min(n - 1, int(0.99 * n))],
        "max": lengths[-1],
        "span_s": (rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1000,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = TraceShape()
    p.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    p.add_argument("--requests", type=int, default=d.requests)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--rate", type=float, default=d.rate, help="mean requests per second")
    p.add_argument("--block-tokens", type=int, default=d.block_tokens, help="tokens per hash id")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="longest prompt")
    p.add_argument("--system-prompts", type=int, default=d.system_prompts, help="shared prefixes sessions open with")
    p.add_argument(
        "--system-blocks",
        default=f"{d.system_blocks[0]}:{d.system_blocks[1]}",
        metavar="LO:HI",
        help="each shared prefix's length in blocks (uniform); e.g. 60:100 makes a hot shared document",
    )


def main(args: argparse.Namespace) -> int:
    lo, _, hi = args.system_blocks.partition(":")
    shape = TraceShape(
        requests=args.requests,
        seed=args.seed,
        rate=args.rate,
        block_tokens=args.block_tokens,
        max_tokens=args.max_tokens,
        system_prompts=args.system_prompts,
        system_blocks=(int(lo), int(hi or lo)),
    )
    rows = generate(shape)
    write_trace(rows, args.out)
    d = describe(rows)
    print(
        f"{args.out}: {d['requests']} requests over {d['span_s']:.0f}s; prompt tokens mean {d['mean']:.0f}, "
        f"median {d['median']}, p99 {d['p99']}, max {d['max']}",
        file=sys.stderr,
    )
    return 0
