"""`kvgate bench multiturn`: can a follow-up ever be answered from another conversation?

Input: a JSON file `{"conversations": [{"id", "group", "kind": "original"|"paraphrase", "turns": [user
texts]}]}` (tests/data/multiturn_conversations.json is ours). A group is one conversation and the
same conversation paraphrased; follow-ups such as "What famous landmark is there?" are shared
between groups on purpose.

Method, per `semantic.context` setting, each with a fresh cache: a fake backend (answers
`Answer <n>: <question>`, unique per call) behind a kvgate proxy (uvicorn, real LiteLLM, the real
embedder), both on 127.0.0.1 in this process. Every original conversation is played turn by turn,
then every paraphrased one; each assistant turn sent back is the answer the proxy gave, as a real
client does. A hit's origin is the conversation whose miss produced the answer text it returned.

- cross_conversation_hits: follow-ups (turn ≥ 2) served an answer from another group (target 0);
- paraphrase_followup_hits: follow-ups of paraphrased conversations served from their original;
- feedback phase: every paraphrased first turn that hit is judged wrong through
  `POST /v1/cache/feedback`, then asked again (no-store): `still_hit_after_feedback` (target 0) and
  the feedback call's latency.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import httpx

from kvgate.tools.bench.stats import percentiles_ms, write_json

MODEL = "multiturn-chat"
KINDS = ("original", "paraphrase")
CONTEXTS = ("exact", "last_user_only", "semantic")
DEFAULT_THRESHOLD = 0.9


@dataclass(frozen=True)
class Conversation:
    id: str
    group: str
    kind: str  # original | paraphrase
    turns: tuple[str, ...]


@dataclass(frozen=True)
class Turn:
    """One user turn as played: how it was served and, on a hit, whose answer it got."""

    conversation: str
    group: str
    kind: str
    index: int  # 0 = the first turn
    tier: str  # miss | exact | semantic
    origin_group: str | None  # group of the conversation whose miss produced the answer (hits only)
    request_id: str


def load_conversations(path: Path) -> list[Conversation]:
    """Read and check the conversations file; ValueError with a one-line reason otherwise."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read conversations from {path}: {exc}") from None
    rows = data.get("conversations") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f'{path}: expected {{"conversations": [...]}} with at least one conversation')
    out, seen = [], set()
    for i, row in enumerate(rows):
        turns = row.get("turns") if isinstance(row, dict) else None
        if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns)):
            raise ValueError(f"{path}: conversations[{i}].turns must be a non-empty list of non-empty strings")
        if row.get("kind") not in KINDS:
            raise ValueError(f"{path}: conversations[{i}].kind must be one of {KINDS}")
        conv = Conversation(str(row.get("id", i)), str(row.get("group", row.get("id", i))), row["kind"], tuple(turns))
        if conv.id in seen:
            raise ValueError(f"{path}: conversation id {conv.id!r} is used twice")
        seen.add(conv.id)
        out.append(conv)
    return out


def play(
    client: httpx.Client,
    conversations: Sequence[Conversation],
    model: str = MODEL,
    headers: dict[str, str] | None = None,
) -> list[Turn]:
    """Play originals, then paraphrases, through the proxy at `client.base_url`; every turn's outcome."""
    origin: dict[str, str] = {}  # answer text → group whose miss produced it
    turns: list[Turn] = []
    ordered = [c for c in conversations if c.kind == "original"] + [c for c in conversations if c.kind == "paraphrase"]
    for conv in ordered:
        messages: list[dict[str, str]] = []
        for index, text in enumerate(conv.turns):
            messages.append({"role": "user", "content": text})
            resp = client.post("/v1/chat/completions", json={"model": model, "messages": messages}, headers=headers)
            resp.raise_for_status()
            answer = resp.json()["choices"][0]["message"]["content"]
            tier = resp.headers["x-kvgate-cache"]
            if tier == "miss":
                origin.setdefault(answer, conv.group)
            turns.append(
                Turn(
                    conv.id,
                    conv.group,
                    conv.kind,
                    index,
                    tier,
                    origin.get(answer) if tier != "miss" else None,
                    resp.headers["x-kvgate-request-id"],
                )
            )
            messages.append({"role": "assistant", "content": answer})
    return turns


def summarise(turns: Sequence[Turn]) -> dict[str, Any]:
    """Counts over played turns (see the module docstring for each figure's meaning)."""
    follow = [t for t in turns if t.index > 0]
    firsts = [t for t in turns if t.index == 0]
    para_follow = [t for t in follow if t.kind == "paraphrase"]
    para_first = [t for t in firsts if t.kind == "paraphrase"]
    cross = [t for t in turns if t.tier != "miss" and t.origin_group not in (None, t.group)]
    return {
        "conversations": len({t.conversation for t in turns}),
        "turns": len(turns),
        "followups": len(follow),
        "followup_hits": sum(t.tier != "miss" for t in follow),
        "cross_conversation_hits": sum(t.index > 0 for t in cross),
        "cross_conversation_first_turn_hits": sum(t.index == 0 for t in cross),
        "paraphrase_followups": len(para_follow),
        "paraphrase_followup_hits": sum(t.tier != "miss" and t.origin_group == t.group for t in para_follow),
        "paraphrase_first_turns": len(para_first),
        "paraphrase_first_turn_hits": sum(t.tier != "miss" and t.origin_group == t.group for t in para_first),
        "cross_conversation_examples": [f"{t.conversation} turn {t.index + 1} <- {t.origin_group}" for t in cross[:5]],
    }


def judge_first_turn_hits(
    client: httpx.Client, conversations: Sequence[Conversation], turns: Sequence[Turn], model: str = MODEL
) -> dict[str, Any]:
    """Call every paraphrased first-turn hit wrong, then ask it again without storing."""
    by_id = {c.id: c for c in conversations}
    judged = [t for t in turns if t.index == 0 and t.kind == "paraphrase" and t.tier != "miss"]
    took, removed, still = [], 0, 0
    for t in judged:
        started = time.perf_counter()
        resp = client.post("/v1/cache/feedback", json={"request_id": t.request_id, "correct": False})
        took.append(time.perf_counter() - started)
        resp.raise_for_status()
        removed += bool(resp.json()["removed"])
    for t in judged:
        body = {"model": model, "messages": [{"role": "user", "content": by_id[t.conversation].turns[0]}]}
        again = client.post("/v1/chat/completions", json=body, headers={"x-kvgate-cache-control": "no-store"})
        still += again.headers["x-kvgate-cache"] != "miss"
    p50, p99 = percentiles_ms(took)
    return {
        "wrong_verdicts": len(judged),
        "entries_removed": removed,
        "still_hit_after_feedback": still,
        "feedback_p50_ms": p50,
        "feedback_p99_ms": p99,
    }


def bench_config(cache_dir: Path, api_base: str, threshold: float, context: str) -> dict[str, Any]:
    return {
        "cache_dir": str(cache_dir),
        "routes": [
            {
                "name": "multiturn",
                "model": MODEL,
                "ttl": None,
                "backend": {"model": "openai/fake", "api_base": api_base, "api_key": "sk-fake"},
                "semantic": {"threshold": threshold, "context": context},
            }
        ],
    }


def run(
    path: Path,
    threshold: float = DEFAULT_THRESHOLD,
    contexts: Sequence[str] = CONTEXTS,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """The whole benchmark: one fresh cache and proxy per context setting."""
    from kvgate.engines.demo import create_fake_app
    from kvgate.index.responses.embedder import make_embedder
    from kvgate.middleware.build import build_pipeline
    from kvgate.middleware.config import parse_config
    from kvgate.middleware.server.proxy import create_app
    from kvgate.tools.bench.procs import ServerThread

    conversations = load_conversations(path)
    embedder = make_embedder("onnx")
    backend = ServerThread(create_fake_app()).start()
    runs: dict[str, Any] = {}
    try:
        for context in contexts:
            with tempfile.TemporaryDirectory(prefix="kvgate-multiturn-") as tmp:
                config = parse_config(bench_config(Path(tmp), f"{backend.url}/v1", threshold, context))
                pipeline = build_pipeline(config, embedder=embedder)
                proxy = ServerThread(create_app(config, pipeline)).start()
                try:
                    with httpx.Client(base_url=proxy.url, timeout=60) as client:
                        started = time.perf_counter()
                        turns = play(client, conversations)
                        result = summarise(turns)
                        result["seconds"] = round(time.perf_counter() - started, 2)
                        result["feedback"] = judge_first_turn_hits(client, conversations, turns)
                finally:
                    proxy.stop()
                    pipeline.close()
            runs[context] = result
            progress(
                f"context={context}: cross-conversation follow-up hits {result['cross_conversation_hits']}, "
                f"paraphrase follow-up hits {result['paraphrase_followup_hits']}/{result['paraphrase_followups']}"
            )
    finally:
        backend.stop()
    return {"mode": "multiturn", "conversations_file": str(path), "threshold": threshold, "runs": runs}


# ------------------------------------------------------------------------------------------ CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--conversations",
        type=Path,
        required=True,
        metavar="FILE.json",
        help="conversations file (see tests/data/multiturn_conversations.json)",
    )
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="route semantic threshold")
    parser.add_argument(
        "--contexts",
        default=",".join(CONTEXTS),
        help=f"comma-separated semantic.context settings to run (default {','.join(CONTEXTS)})",
    )
    parser.add_argument("--json", type=Path, metavar="OUT", default=None, help="write the results here (JSON)")


def main(args: argparse.Namespace) -> int:
    """Run and print a summary table; 0 on success, 2 on bad input."""
    from kvgate.tools.bench.machine import machine_info

    contexts = [c.strip() for c in args.contexts.split(",") if c.strip()]
    bad = [c for c in contexts if c not in CONTEXTS]
    if bad or not contexts or not 0.0 <= args.threshold <= 1.0:
        print(f"kvgate bench multiturn: error: --contexts takes {CONTEXTS}, --threshold 0..1", file=sys.stderr)
        return 2
    try:
        result = run(
            args.conversations,
            args.threshold,
            contexts,
            progress=lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True),
        )
    except ValueError as exc:
        print(f"kvgate bench multiturn: error: {exc}", file=sys.stderr)
        return 2
    result["machine"] = machine_info()
    print(
        f"{'context':16s} {'follow-ups':>10s} {'cross hits':>10s} {'paraphrase hits':>16s} {'after feedback':>15s} {'feedback p50':>13s}"
    )
    for context, r in result["runs"].items():
        fb = r["feedback"]
        print(
            f"{context:16s} {r['followups']:>10d} {r['cross_conversation_hits']:>10d} "
            f"{r['paraphrase_followup_hits']:>7d}/{r['paraphrase_followups']:<8d} "
            f"{fb['still_hit_after_feedback']:>6d}/{fb['wrong_verdicts']:<8d} {fb['feedback_p50_ms'] or 0:>10.2f} ms"
        )
    write_json(args.json, result)
    if args.json is not None:
        print(f"results written to {args.json}")
    return 0
