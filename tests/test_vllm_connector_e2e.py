"""kvgate's KV connector inside the session's two real vLLM servers (`vllm_pair`: one shared disk
tier, raw chunks): a next turn on the other engine loads its history (in the background, as a
history of that size is estimated slower than a step), a damaged chunk is recomputed
with the same output and no client error, and kvgate's router learns the shared tier from the
engines' own events."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import wait_until
from tests.test_vllm_e2e import config, proxy_factory  # noqa: F401 - the fixture

FACTS = " ".join(
    f"Item {i}: the {('north', 'south', 'east', 'west')[i % 4]} gate opens at {i % 12 + 1} o'clock "
    f"and the keeper's dog is called {('Rex', 'Bo', 'Max', 'Ivy')[i % 4]}."
    for i in range(40)
)


def ask(server: Any, messages: list[dict[str, str]]) -> tuple[str, int, int]:
    body = {"model": "smollm2", "messages": messages, "max_tokens": 12, "temperature": 0}
    r = httpx.post(f"{server.api_base}/chat/completions", json=body, timeout=180)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return (
        r.json()["choices"][0]["message"]["content"],
        usage["prompt_tokens"],
        int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
    )


def conversation() -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Session {uuid.uuid4()}. Remember: {FACTS}"}]


def next_turn(first: list[dict[str, str]], answer: str) -> list[dict[str, str]]:
    return [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "Which gate opens first?"}]


def tier_dir(servers: list[Any]) -> Path:
    return Path(servers[0].kv_connector["tiers"]["disk"]["path"])


def test_the_next_turn_on_the_other_engine_loads_its_history(vllm_pair):
    a, b = vllm_pair
    first = conversation()
    answer, history, _ = ask(a, first)
    later = next_turn(first, answer)
    time.sleep(1.0)  # the connector writes chunks in the background
    text_b, prompt_b, cached_b = ask(b, later)  # b never computed this conversation
    text_a, _, cached_a = ask(a, later)  # a from its own prefix cache
    assert cached_b >= (history - 1) // 128 * 128 > 0  # the whole history's blocks, loaded
    assert text_b == text_a  # raw chunks: the loaded KV is the computed KV
    assert wait_until(lambda: metric(b, "vllm:kvgate_loaded_chunks_total") >= (history - 1) // 128, 20)
    # a history this long is estimated slower than the background threshold: it loaded beside b's steps
    assert metric(b, "vllm:kvgate_background_loads_total") >= 1
    assert metric(b, "vllm:kvgate_gate_load_gbps") > 0  # the gate's estimate, on b's /metrics


def test_a_damaged_chunk_is_recomputed_not_served(vllm_pair):
    a, b = vllm_pair
    first = conversation()
    t0 = time.time()
    answer, history, _ = ask(a, first)
    time.sleep(1.5)
    damaged = 0
    for f in tier_dir(vllm_pair).rglob("*.val"):
        if f.stat().st_mtime >= t0 - 1:
            data = bytearray(f.read_bytes())
            if damaged % 2:
                data = data[: len(data) // 2]  # truncated
            else:
                data[len(data) // 2] ^= 0xFF  # a flipped bit
            f.write_bytes(bytes(data))
            damaged += 1
    assert damaged >= (history - 1) // 128
    later = next_turn(first, answer)
    text_b, _, _ = ask(b, later)  # a client sees an answer, not an error
    text_a, _, _ = ask(a, later)
    assert text_b == text_a  # recomputed (vLLM still counts the tokens it planned to load as cached)
    # the engine's log reaches its file when its stdout flushes, not when the answer is sent
    assert wait_until(
        lambda: all(
            text in b.log_path.read_text(errors="replace")
            for text in ("dropping corrupt KV chunk", "KV chunks could not be loaded; vLLM recomputes them")
        ),
        20,
    )
    assert wait_until(lambda: metric(b, "vllm:kvgate_load_errors_total") >= 1, 20)  # counted


def metric(server: Any, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_the_router_learns_the_shared_tier_from_the_engines(vllm_pair, proxy_factory, tmp_path):  # noqa: F811
    proxy = proxy_factory(config(tmp_path, vllm_pair))
    first = conversation()
    answer, history, _ = ask(vllm_pair[0], first)
    ask(vllm_pair[1], conversation())  # b stores into the tier too: it reads it
    router = proxy.router
    assert wait_until(
        lambda: (
            router.precise is not None
            and all(any(t.startswith("tier:disk:") for t in router.precise.tiers.readable(n)) for n in ("v1", "v2"))
        ),
        30,
    )
    plan = router.plan(next_turn(first, answer))  # unsalted, as the engines were asked directly
    blocks = (history - 1) // 128
    assert plan.tier_blocks.get("v1", 0) >= blocks and plan.tier_blocks.get("v2", 0) >= blocks
    assert plan.loadable_tokens("v2") >= blocks * 128 - plan.matched_tokens("v2")
    scraped = proxy.client.get("/metrics").text
    assert 'kvgate_replica_kv_tier_blocks{replica="v2",route="vllm",tier="tier:disk:' in scraped
    assert 'kvgate_route_load_cost{route="vllm"}' in scraped


def test_a_decode_stream_keeps_going_while_histories_load(vllm_pair):
    """`kvgate bench vllm-kv`'s inter-token measurement on the real engines: B streams while two
    histories A stored load into B beside it; both loads are served from the tier."""
    from kvgate.tools.bench.vllm_kv_itl import itl_during_loads

    a, b = vllm_pair
    firsts = [conversation() for _ in range(2)]
    answers = [ask(a, first)[0] for first in firsts]
    time.sleep(1.5)
    got = itl_during_loads(b.api_base, 48, [next_turn(f, ans) for f, ans in zip(firsts, answers)])
    assert got["itl_p99_no_loads_s"] > 0 and got["itl_p99_during_loads_s"] > 0
    assert all(c >= 128 for c in got["loads_cached_tokens"])
    print("inter-token p99 during loads / alone:", got["itl_p99_during_loads_s"], got["itl_p99_no_loads_s"])
