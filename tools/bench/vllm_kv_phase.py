"""One phase of `kvgate bench vllm-kv`: a fresh pair of real vLLM servers in one configuration
(no connector, vLLM's ExampleConnector, or kvgate's connector over a disk or Redis tier with one
codec), the conversations' turn k on engine A, then their next turn on engine B; optionally a
restart of A followed by next turns on A, decode speed on both engines at once, and B's decode
pace while other histories load into it (vllm_kv_itl.py)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from kvgate.engines.vllm.launch import start_pair
from kvgate.tools.bench.vllm_kv_client import Reply, ask, decode_tps, first_message, next_turn
from kvgate.tools.bench.vllm_kv_itl import itl_during_loads


@dataclass
class Conversation:
    index: int
    first: str
    answer: str = ""  # the cold run's turn-k answer: every phase sends the same next-turn prompt

    def turn_k(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.first}]

    def turn_next(self) -> list[dict[str, str]]:
        return next_turn(self.first, self.answer, self.index)


def conversations(start: int, n: int, history_tokens: int) -> list[Conversation]:
    return [Conversation(i, first_message(i, history_tokens)) for i in range(start, start + n)]


@dataclass
class PhaseResult:
    name: str
    turn_k: list[Reply] = field(default_factory=list)
    next_turn: list[Reply] = field(default_factory=list)  # on engine B
    again: list[Reply] = field(default_factory=list)  # the same next turns on B again: its own prefix cache
    restart_next: list[Reply] = field(default_factory=list)  # on engine A after its restart
    decode_tps: list[float] = field(default_factory=list)  # per engine, the median of its runs
    itl: dict[str, Any] = field(default_factory=dict)  # B's decode stream with and without loads beside it
    connector: dict[str, float] = field(default_factory=dict)  # B's vllm:kvgate_* counters after the next turns
    seconds: float = 0.0


def warm(servers: Sequence[Any], tag: str, history_tokens: int) -> None:
    """Before anything is measured, every engine serves one long prompt of its own and then the
    other engine's as a next turn (a load where a connector holds it, a prefill where none does):
    the first long prefill and the first load of a fresh engine pay a one-off set-up (seconds on
    this build) that a serving engine has long paid. Every phase does the same."""
    firsts = [first_message(900 + i, history_tokens) for i in range(len(servers))]
    answers = [
        ask(s.api_base, [{"role": "user", "content": f"Warm-up {tag}. {f}"}], max_tokens=4, logprobs=False).text
        for s, f in zip(servers, firsts)
    ]
    for i, s in enumerate(servers):
        j = (i + 1) % len(servers)
        ask(s.api_base, next_turn(f"Warm-up {tag}. {firsts[j]}", answers[j], j), max_tokens=4, logprobs=False)


def connector_counters(api_base: str) -> dict[str, float]:
    import httpx

    text = httpx.get(api_base.removesuffix("/v1") + "/metrics", timeout=30).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:kvgate_") and " " in line:
            name = line.split("{", 1)[0].split(" ", 1)[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def run_phase(
    name: str,
    model: str,
    log_dir: Path,
    convs: Sequence[Conversation],
    *,
    connector: dict[str, Any] | None = None,
    extra_args: Sequence[str] = (),
    restart: Sequence[Conversation] = (),
    decode_runs: int = 0,
    decode_tokens: int = 256,
    itl: Sequence[Conversation] = (),
    say: Callable[[str], None] = print,
    settle_s: float = 2.0,
    warm_tokens: int = 1800,
) -> PhaseResult:
    t0 = time.perf_counter()
    out = PhaseResult(name)
    phase_logs = log_dir / name
    phase_logs.mkdir(parents=True, exist_ok=True)
    say(f"[{name}] starting two vLLM servers")
    servers = start_pair(model, log_dir=phase_logs, timeout=300, kv_connector=connector, extra_args=list(extra_args))
    a, b = servers
    try:
        warm(servers, name, warm_tokens)
        for c in list(convs) + list(restart):
            out.turn_k.append(ask(a.api_base, c.turn_k()))
            if not c.answer:
                c.answer = out.turn_k[-1].text
        time.sleep(settle_s)  # the last turn's chunks reach the tier (written in the background)
        say(f"[{name}] turn k of {len(convs) + len(restart)} conversations done on A; next turns on B")
        out.next_turn = [ask(b.api_base, c.turn_next()) for c in convs]
        if connector is not None:
            time.sleep(2.0)  # the engine's stats reach /metrics
            out.connector = connector_counters(b.api_base)
        out.again = [ask(b.api_base, c.turn_next()) for c in convs]
        if itl:
            for c in itl:  # histories A stores in the tier, that B has never seen
                c.answer = c.answer or ask(a.api_base, c.turn_k()).text
            time.sleep(settle_s)
            say(f"[{name}] B's decode stream alone, then while {len(itl)} histories load into B")
            out.itl = itl_during_loads(b.api_base, decode_tokens, [c.turn_next() for c in itl])
        if restart:
            say(f"[{name}] restarting A")
            a.stop()
            a.start().wait_ready(300)
            warm([a], name + "-restarted", warm_tokens)
            out.restart_next = [ask(a.api_base, c.turn_next()) for c in restart]
        if decode_runs:
            say(f"[{name}] decode speed, one engine at a time, alternating")
            runs: dict[int, list[float]] = {i: [] for i in range(len(servers))}
            for k in range(decode_runs):
                for i, s in enumerate(servers):
                    runs[i].append(decode_tps(s.api_base, k, decode_tokens))
            out.decode_tps = [statistics.median(r) for r in runs.values()]
    finally:
        for s in servers:
            s.stop()
    out.seconds = time.perf_counter() - t0
    return out


def example_connector_args(directory: Path) -> list[str]:
    import json

    cfg = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(directory)},
    }
    return ["--kv-transfer-config", json.dumps(cfg)]
