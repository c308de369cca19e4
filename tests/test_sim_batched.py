"""The batched simulator model: block cache (pinning, leaf-first LRU), the step planner (token
budget, decode first, chunked prefill), and the engine behind the sim-replica HTTP face."""

from __future__ import annotations

import asyncio

from fastapi.testclient import TestClient

from kvgate.engines.sim.base import SimRequest
from kvgate.engines.sim.batch_scheduler import BatchScheduler, Seq
from kvgate.engines.sim.batched import BatchedEngine
from kvgate.engines.sim.block_cache import BlockCache
from kvgate.engines.sim.server import add_arguments, build_engine, create_sim_app

BS = 16


def chain(tag: str, n: int) -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


def req(tag: str, blocks: int, out: int = 4, extra: int = 1) -> SimRequest:
    """A prompt of `blocks` full blocks + `extra` tokens (hashes are labels: the cache only compares them)."""
    n = blocks * BS + extra
    return SimRequest(tokens=list(range(n)), hashes=chain(tag, blocks), completion_tokens=out)  # type: ignore[arg-type]


def sched(capacity_blocks: int = 100, step_tokens: int = 64, **kw) -> BatchScheduler:
    return BatchScheduler(
        BlockCache(capacity_blocks), BS, step_tokens=step_tokens, overhead_s=0.001, token_s=0.0001, **kw
    )


def run_step(s: BatchScheduler, now: float = 0.0):
    plan = s.plan(now)
    assert plan is not None
    return plan, s.commit(plan, now + plan.step_s * plan.steps)


# -- block cache ------------------------------------------------------------------------------------


def test_block_cache_evicts_lru_leaves_first_and_never_orphans():
    c = BlockCache(6)
    a, b = chain("a", 4), chain("b", 2)
    c.store(a, 0, 4)
    c.release(a)
    c.store(b, 0, 2)
    c.release(b)  # a (4) + b (2) = 6 = capacity
    new, evicted = c.store(chain("c", 3), 0, 3)
    # the least recently used leaves go first: a's tail, last block first; heads stay
    assert evicted == ["a3", "a2", "a1"] and new == [0, 1, 2]
    assert c.match(a) == 1 and c.match(b) == 2
    for h in c.hashes():  # no orphan: every held block's parent is held
        if h[1:] != "0":
            assert f"{h[0]}{int(h[1:]) - 1}" in c


def test_block_cache_pinned_blocks_are_never_evicted():
    c = BlockCache(4)
    a = chain("a", 4)
    c.store(a, 0, 4)  # pinned by its request
    assert c.pinned_blocks == 4 and c.available() == 0
    assert c.fits(chain("b", 2), 0, 2) == 0
    new, evicted = c.store(chain("b", 2), 0, 2)  # without force: nothing fits, nothing evicted
    assert new == [] and evicted == [] and c.match(a) == 4
    c.release(a[2:])  # a request holding only the head would keep a0, a1 pinned
    assert c.fits(chain("b", 3), 0, 3) == 2
    new, evicted = c.store(chain("b", 3), 0, 3)
    assert new == [0, 1] and evicted == ["a3", "a2"] and c.match(a) == 2
    new, evicted = c.store(chain("x", 2), 0, 2, force=True)  # forced past capacity: nothing evictable
    assert new == [0, 1] and evicted == [] and len(c) == 6


def test_block_cache_reuse_pins_held_blocks_before_making_room():
    c = BlockCache(3)
    a = chain("a", 2)
    c.store(a, 0, 2)
    c.release(a)
    # a second request computes a0, a1 again plus one new block: the held ones are re-pinned, not evicted
    longer = a + ["a2"]
    new, evicted = c.store(longer, 0, 3)
    assert new == [2] and evicted == [] and c.refs("a0") == 1 and c.pinned_blocks == 3


# -- step planner -----------------------------------------------------------------------------------


def test_token_budget_is_shared_by_chunks_in_fifo_order():
    s = sched(step_tokens=64)
    a, b = Seq(req("a", 6), 0.0), Seq(req("b", 6), 0.0)  # 97 tokens each
    s.add(a)
    s.add(b)
    plan, _ = run_step(s)
    assert [(q.req.hashes[0], c) for q, c in plan.chunks] == [("a0", 64)] and plan.tokens == 64
    plan, marked = run_step(s)
    assert [(q.req.hashes[0], c) for q, c in plan.chunks] == [("a0", 33), ("b0", 31)]  # a's rest, then b
    assert a.generated == 1 and a in marked and a.first_at is not None  # first token at the end of a's last chunk
    assert abs(plan.step_s - (0.001 + 0.0001 * 64)) < 1e-12


def test_running_decodes_take_their_token_first():
    s = sched(step_tokens=8)
    ds = [Seq(req(f"d{i}", 0, out=50, extra=2), 0.0) for i in range(3)]
    for d in ds:
        s.add(d)
    run_step(s)  # three 2-token prompts prefill in one step
    assert all(d.generated == 1 for d in ds)
    long = Seq(req("L", 10), 0.0)
    s.add(long)
    plan, _ = run_step(s)
    assert len(plan.decodes) == 3 and plan.chunks == [(long, 5)] and plan.tokens == 8


def test_decode_only_steps_run_in_one_plan_up_to_the_next_mark():
    s = sched(step_tokens=64)
    d = Seq(req("d", 0, out=17, extra=2), 0.0, pieces=4)  # marks at 1, 5, 9, 13, 17
    s.add(d)
    run_step(s)
    plan, marked = run_step(s)
    assert plan.steps == 4 and d.generated == 5 and marked == [d]


def test_a_later_request_reuses_blocks_stored_by_an_earlier_chunk():
    s = sched(step_tokens=100)
    a = Seq(req("p", 8), 0.0)  # 129 tokens
    s.add(a)
    run_step(s)  # a's first 100 tokens: blocks p0..p5 stored
    b = Seq(req("p", 8), 0.0)  # the same prompt arrives
    s.add(b)
    plan, _ = run_step(s)
    # a's last chunk (scheduled first in this step) stored p6, p7: b is admitted behind it and
    # matches all 8 blocks; both pin the shared prefix
    assert plan.chunks == [(a, 29), (b, 1)] and b.cached == 8 * BS and s.cache.refs("p0") == 2


def test_admission_waits_for_cache_space_then_a_stuck_step_is_forced():
    s = sched(capacity_blocks=5, step_tokens=64)
    a = Seq(req("a", 3, out=3), 0.0)  # 49 tokens, 3 blocks
    s.add(a)
    run_step(s)  # a prefilled: its 3 blocks stay pinned while it decodes
    b = Seq(req("b", 4), 0.0)  # 65 tokens, 4 blocks
    s.add(b)
    plan, _ = run_step(s)
    assert plan.chunks == [(b, 32)] and b.pinned == 2  # b goes as far as the 2 free blocks allow
    plan, _ = run_step(s)  # a's last token; b cannot store its 3rd block yet
    assert plan.chunks == [] and plan.decodes == [a] and a.finished and s.cache.pinned_blocks == 2
    plan, _ = run_step(s)  # a's blocks are evictable now: b finishes its prefill
    assert plan.chunks == [(b, 33)] and b.generated == 1 and s.overcommits == 0
    # everything pinned and nothing decoding: the oldest prefill is forced past capacity
    s2 = sched(capacity_blocks=2, step_tokens=64)
    c = Seq(req("c", 4), 0.0)
    s2.add(c)
    plan, _ = run_step(s2)
    assert plan.chunks == [(c, 32)]
    plan, _ = run_step(s2)
    assert s2.overcommits == 1 and c.generated == 1 and len(s2.cache) == 4


# -- engine + HTTP face ---------------------------------------------------------------------------


def test_batched_replica_reports_cached_tokens_and_events():
    stored, removed = [], []
    engine = BatchedEngine(
        16 * 64,
        BS,
        prefill_tps=1e6,
        decode_tps=1e4,
        step_tokens=256,
        on_stored=lambda h, t, p: stored.append((list(h), len(t), p)),
        on_removed=lambda h: removed.append(list(h)),
    )
    client = TestClient(create_sim_app(engine, name="b0"))
    body = {"model": "m", "messages": [{"role": "user", "content": "hello " * 100}], "max_tokens": 5}
    first = client.post("/v1/chat/completions", json=body).json()
    again = client.post("/v1/chat/completions", json=body).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    prompt = again["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == (prompt - 1) // BS * BS
    assert again["choices"][0]["message"]["content"].split()[0] == "[b0]"
    # events: runs of consecutive blocks, each with its tokens and the parent of its first block
    assert sum(len(h) for h, _, _ in stored) == prompt // BS and stored[0][2] is None
    assert all(n == len(h) * BS for h, n, _ in stored)
    stats = client.get("/stats").json()
    assert stats["sim_model"] == "batched" and stats["completed"] == 2 and stats["pinned_blocks"] == 0
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
        chunks = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert chunks[-1] == "data: [DONE]" and '"cached_tokens"' in chunks[-2]


def test_sim_replica_flag_builds_the_batched_engine():
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(
        [
            "--port",
            "1",
            "--capacity-tokens",
            "1600",
            "--prefill-tps",
            "1000",
            "--decode-tps",
            "100",
            "--sim-model",
            "batched",
            "--step-tokens",
            "512",
        ]
    )
    engine = build_engine(args)
    assert isinstance(engine, BatchedEngine) and engine.step_tokens == 512
    assert abs(engine.overhead_s - (0.01 - 0.001)) < 1e-12  # a lone decode step lasts 1 / decode_tps


def test_cancelled_request_releases_its_place():
    engine = BatchedEngine(16 * 64, BS, prefill_tps=1e4, decode_tps=100, step_tokens=64)

    async def main():
        r = engine.request([{"role": "user", "content": "x" * 2000}], 50)
        gen = engine.generate(r)
        task = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await gen.aclose()
        return engine.stats()

    stats = asyncio.run(main())
    assert stats["in_flight"] == 0 and stats["pinned_blocks"] == 0


def test_render_and_tokenize_give_the_prompt_tokens_like_vllm():
    """vllm-router asks a worker for a chat prompt's token ids (/v1/chat/completions/render, then
    /tokenize) before routing on them; both sim models answer in vLLM's shapes."""
    from kvgate.engines.sim.engine import SimEngine

    for engine in (
        SimEngine(1600, prefill_tps=1e6, decode_tps=1e6),
        BatchedEngine(1600, prefill_tps=1e6, decode_tps=1e6),
    ):
        client = TestClient(create_sim_app(engine, name="s"))
        messages = [{"role": "user", "content": "hello"}]
        ids = client.post("/v1/chat/completions/render", json={"model": "m", "messages": messages}).json()["token_ids"]
        assert ids == engine.request(messages).tokens and len(ids) == len("<|user|>\nhello\n<|assistant|>\n")
        tok = client.post("/tokenize", json={"model": "m", "messages": messages}).json()
        assert tok["tokens"] == ids and tok["count"] == len(ids) and tok["max_model_len"] > 0
        assert client.post("/tokenize", json={"model": "m", "prompt": "abc"}).json()["tokens"] == [97, 98, 99]
        assert client.post("/v1/chat/completions/render", json={"messages": []}).status_code == 400
