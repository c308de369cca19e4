"""The proxy's hot path: prompt-sized work off the event loop, each prompt hashed once, and the
same hashes and routing decisions as before."""

from __future__ import annotations

import json
import threading
from typing import Any, Sequence

import httpx
import pytest

from kvgate.engines.demo import Calls, create_fake_app
from kvgate.index.kv.prefix import PrefixIndex
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import TextTokenizer
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.cache.offload import INLINE_NEW_CHARS, prompt_chars
from kvgate.middleware.config import PrefixConfig, ReplicaConfig, RoutingConfig, parse_config
from kvgate.middleware.routing.records import INLINE_RECORD_BLOCKS
from kvgate.middleware.routing.router import Router
from kvgate.middleware.routing.state_local import LocalState
from kvgate.middleware.server.body import OFF_LOOP_BODY_BYTES, _parse_body
from kvgate.middleware.server.proxy import create_app
from kvgate.middleware.server.schema import ChatCompletionRequest
from kvgate.tools.bench.procs import ServerThread


class Recording(TextTokenizer):
    """The text tokenizer, noting which thread renders or encodes what."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []  # (what, thread name)
        self.encoded: list[str] = []

    def segments(self, messages: Sequence[dict[str, Any]]) -> list[str]:
        self.calls.append(("segments", threading.current_thread().name))
        return super().segments(messages)

    def packed(self, segment: str) -> bytes:  # what the router's hasher encodes with
        self.calls.append(("encode", threading.current_thread().name))
        self.encoded.append(segment)
        return super().packed(segment)


def chat(turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are terse. " * 40}]
    for t in range(turns):
        msgs += [
            {"role": "user", "content": f"question {t} " * 30},
            {"role": "assistant", "content": f"answer {t} " * 20},
        ]
    return msgs + [{"role": "user", "content": "and finally?"}]


# ------------------------------------------------------------------ PromptHasher.prompt(known=...)
def test_resuming_from_known_states_gives_the_full_computation():
    prompt, answer = chat(3), {"role": "assistant", "content": "the final answer " * 25}
    fresh = PromptHasher(TextTokenizer(), 16).hashes([*prompt, answer])
    tok = Recording()
    hasher = PromptHasher(tok, 16, cache_size=1)  # the shared caches forget almost at once
    known = hasher.prompt(prompt)
    hasher.prompt([{"role": "user", "content": "another conversation entirely"}])  # evicts the prompt's states
    tok.encoded.clear()
    assert hasher.prompt([*prompt, answer], known).hashes == fresh[0]
    # only the answer and the new generation prompt were tokenised: the prompt resumed from `known`
    assert tok.encoded == TextTokenizer().segments([*prompt, answer])[-2:]


def test_a_prompt_stopped_early_completes_to_the_eager_result():
    """`until` stops hashing at a block it refuses; complete() then gives exactly the eager
    hashes, token count and cached chain states (the next turn resumes from them)."""
    prompt = [*chat(3), {"role": "assistant", "content": "the final answer " * 25}]
    eager = PromptHasher(TextTokenizer(), 16).prompt(prompt)
    hasher = PromptHasher(TextTokenizer(), 16)
    asked: list[int] = []
    lazy = hasher.prompt(prompt, until=lambda h: asked.append(h) is not None)  # refuses every block
    assert lazy.partial and lazy.tokens == eager.tokens and lazy.blocks == len(eager.hashes)
    assert asked and len(lazy.hashes) < len(eager.hashes) and lazy.hashes == eager.hashes[: len(lazy.hashes)]
    assert asked[0] == lazy.hashes[-1]  # stopped at the first block it asked about
    assert hasher.uncached_chars(prompt) > 0  # not "seen" until its chain states exist
    assert lazy.complete() is lazy and not lazy.partial
    assert lazy.hashes == eager.hashes and lazy.states == eager.states
    assert hasher.uncached_chars(prompt) == 0
    tok = Recording()
    hasher.tokenizer = tok
    assert hasher.prompt(prompt).hashes == eager.hashes and tok.encoded == []  # resumed from the cache
    # a stretch that `until` accepts is not a stop: accepting everything is the eager result
    assert not PromptHasher(TextTokenizer(), 16).prompt(prompt, until=lambda h: True).partial


def test_a_prepared_match_is_the_full_match_even_when_records_land_after_hashing():
    reps = [ReplicaConfig(name=f"r{i}", api_base=f"http://127.0.0.1:{9000 + i}/v1") for i in range(3)]
    cfg = RoutingConfig(prefix=PrefixConfig(tokenizer="text", block_size=16, record_answers=True))
    r = Router(reps, cfg, defer_records=True)  # prepare hashes lazily, as with deferred records
    msgs = long_chat(2)
    full = PromptHasher(TextTokenizer(), 16).hashes(msgs)[0]
    r.index.record("r2", full)
    r.index.held = lambda h: False  # type: ignore[method-assign]  # as if the record landed after hashing
    r.prepare(msgs)
    plan = r.plan(msgs)
    assert plan.matched_blocks["r2"] == len(full) and plan.prompt is not None and not plan.prompt.partial


def test_a_fresh_prompt_is_matched_on_its_first_blocks_and_recorded_whole():
    idx = ThreadNoting(None)
    reps = [ReplicaConfig(name=f"r{i}", api_base=f"http://127.0.0.1:{9000 + i}/v1") for i in range(2)]
    r = Router(reps, RoutingConfig(prefix=PrefixConfig(tokenizer="text", block_size=16)), index=idx, defer_records=True)
    try:
        msgs = long_chat(1)
        full = PromptHasher(TextTokenizer(), 16).hashes(msgs)[0]
        r.prepare(msgs)
        plan = r.plan(msgs)
        assert plan.prompt is not None and plan.prompt.partial and len(plan.hashes) < len(full)
        assert plan.matched_blocks == {"r0": 0, "r1": 0} and plan.prompt_tokens == len(
            "".join(TextTokenizer().segments(msgs))
        )
        r.started(r.replicas[1], plan)
        assert r.settle(10.0)
        assert idx.threads and all(t.startswith("kvgate-index") for t in idx.threads)  # hashed and recorded there
        assert r.index.match(full) == {"r0": 0, "r1": len(full)} and plan.prompt.hashes == full
        r.prepare(msgs)  # the same prompt again: matched in full on r1
        assert r.plan(msgs).matched_blocks["r1"] == len(full)
    finally:
        r.close()


def test_plan_says_whether_the_longest_match_is_a_shared_prefix():
    """Router.plan: shared_prefix is false while the matched prefix is one conversation's own
    (only its turns went on from it), true once another conversation continued it differently."""
    r = router()
    doc = "a document several conversations read. " * 8
    one = [{"role": "user", "content": doc + "question one?"}]
    r.index.record("r1", r.plan(one).hashes)
    follow = [*one, {"role": "assistant", "content": "an answer."}, {"role": "user", "content": "and then?"}]
    plan = r.plan(follow)
    assert plan.matched_blocks["r1"] > 0 and not plan.shared_prefix
    r.index.record("r2", r.plan([{"role": "user", "content": doc + "another question entirely?"}]).hashes)
    other = r.plan([{"role": "user", "content": doc + "Zebras? (its first letter differs from both)"}])
    assert max(other.matched_blocks.values()) > 0 and other.shared_prefix
    assert not r.plan(follow).shared_prefix  # its match still ends inside its own history
    assert not r.plan([{"role": "user", "content": "nothing anyone sent"}]).shared_prefix


# ------------------------------------------------------------------ Router.prepare / answer_hashes
class Shared(LocalState):
    """A LocalState standing for one other processes share: answers are hashed as they finish
    (a process routing alone notes them for their next turn: tests/test_pending_answers.py)."""

    shared = True


def router(shared: bool = False, **cfg: Any) -> Router:
    reps = [ReplicaConfig(name=f"r{i}", api_base=f"http://127.0.0.1:{9000 + i}/v1") for i in range(3)]
    state = Shared([r.name for r in reps]) if shared else None
    return Router(reps, RoutingConfig(prefix=PrefixConfig(tokenizer="text", block_size=16, **cfg)), state=state)


def test_prepared_plan_equals_a_computed_one_and_is_taken_once():
    a, b = router(), router()
    msgs = chat(2)
    b.index.record("r1", b.plan(chat(1)).hashes)  # something to match
    a.index.record("r1", a.plan(chat(1)).hashes)
    a.prepare(msgs)
    planned = a.plan(msgs)
    assert planned.hashes == b.plan(msgs).hashes and planned.matched_blocks == b.plan(msgs).matched_blocks
    assert planned.prompt_tokens == b.plan(msgs).prompt_tokens and planned.matched_blocks["r1"] > 0
    assert a.planner.waiting == 0  # consumed
    a.prepare(msgs)
    a.plan(list(msgs))  # an equal list is not the same request's list: planned afresh
    assert a.planner.waiting == 1
    a.plan(msgs)
    assert a.planner.waiting == 0


def test_answer_hashes_resume_from_the_prompt_and_are_what_finished_records():
    answer = {"role": "assistant", "content": "a long answer " * 30}
    r = router(shared=True)
    msgs = chat(2)
    plan = r.plan(msgs)
    ticket = r.started(r.replicas[0], plan)
    hashes = r.answer_hashes(plan, [*msgs, answer])
    full = PromptHasher(TextTokenizer(), 16).hashes([*msgs, answer])[0]
    assert hashes == full and hashes[: len(plan.hashes)] == plan.hashes
    r.finished(ticket, True, hashes)
    assert r.index.match(full)["r0"] == len(full)


class ThreadNoting(PrefixIndex):
    """The real index, noting the thread of each record."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.threads: list[str] = []

    def record(self, replica: str, hashes: Sequence[int], parent: int | None = None) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().record(replica, hashes, parent)


def long_chat(turns: int) -> list[dict[str, Any]]:
    """chat(turns) behind a system prompt long enough that every chain is past INLINE_RECORD_BLOCKS."""
    msgs = chat(turns)
    return [{"role": "system", "content": "You are terse. " * 160}, *msgs[1:]]


def test_deferred_records_run_in_order_off_the_callers_thread_and_reads_see_them():
    reps = [ReplicaConfig(name=f"r{i}", api_base=f"http://127.0.0.1:{9000 + i}/v1") for i in range(3)]
    cfg = RoutingConfig(prefix=PrefixConfig(tokenizer="text", block_size=16))
    index = ThreadNoting(cfg.prefix.capacity_blocks)
    r = Router(reps, cfg, index=index, defer_records=True, state=Shared([x.name for x in reps]))
    inline = router(shared=True)
    answer = {"role": "assistant", "content": "a long answer " * 30}
    assert len(r.plan(long_chat(1)).hashes) > INLINE_RECORD_BLOCKS
    try:
        for turn in range(1, 6):
            msgs = long_chat(turn)
            r.prepare(msgs)  # hashes and matches after settling the records before it
            plan, same = r.plan(msgs), inline.plan(msgs)
            # the previous turns' records, made off this thread, are seen as an inline router sees its own
            assert plan.matched_blocks == same.matched_blocks and (turn == 1 or plan.matched_blocks["r2"] > 0)
            ticket = r.started(r.replicas[2], plan)
            r.finished(ticket, True, r.answer_hashes(plan, [*msgs, answer]))
            inline.finished(inline.started(inline.replicas[2], same), True, inline.answer_hashes(same, [*msgs, answer]))
        r.settle()
        assert len(index.threads) == 10  # started and finished of five turns, none lost
        # turn 1's start and every finish record a long chain: off this thread; a later turn's
        # start records only its new turn (what r2 does not hold yet), short enough to run here
        assert sum(name.startswith("kvgate-index") for name in index.threads) >= 6
    finally:
        r.close()


class ArgsNoting(PrefixIndex):
    """The real index, noting each record's length and parent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[int, int | None]] = []

    def record(self, replica: str, hashes: Sequence[int], parent: int | None = None) -> list[int]:
        self.calls.append((len(hashes), parent))
        return super().record(replica, hashes, parent)


@pytest.mark.parametrize("answers", ["at_finish", "noted", "off"])
def test_a_start_records_only_what_the_replica_lacks_when_the_answer_will_record_it_all(answers):
    reps = [ReplicaConfig(name=f"r{i}", api_base=f"http://127.0.0.1:{9000 + i}/v1") for i in range(2)]
    cfg = RoutingConfig(prefix=PrefixConfig(tokenizer="text", block_size=16, record_answers=answers != "off"))
    index = ArgsNoting(cfg.prefix.capacity_blocks)
    r = Router(reps, cfg, index=index, state=Shared([x.name for x in reps]) if answers == "at_finish" else None)
    first = r.plan(chat(1))
    r.finished(r.started(r.replicas[0], first), True, r.answer_hashes(first, chat(2)[:-1]))
    plan = r.plan(chat(2))
    held = plan.matched_blocks["r0"]
    assert 0 < held < len(plan.hashes)
    index.calls.clear()
    ticket = r.started(r.replicas[0], plan)
    if answers == "at_finish":  # the new part, linked to the last block held
        assert index.calls == [(len(plan.hashes) - held, plan.hashes[held - 1])]
    else:  # the start may be the only record: all of it, touched
        assert index.calls == [(len(plan.hashes), None)]
    assert r.index.match(plan.hashes)["r0"] == len(plan.hashes)
    r.finished(ticket, True, r.answer_hashes(plan, [*chat(2), {"role": "assistant", "content": "ok"}]))
    assert r.index.match(plan.hashes)["r0"] == len(plan.hashes)


def test_a_short_chain_is_recorded_on_the_callers_thread_unless_records_are_queued():
    reps = [ReplicaConfig(name=f"r{i}", api_base=f"http://127.0.0.1:{9000 + i}/v1") for i in range(2)]
    cfg = RoutingConfig(prefix=PrefixConfig(tokenizer="text", block_size=16))
    index = ThreadNoting(cfg.prefix.capacity_blocks)
    r = Router(reps, cfg, index=index, defer_records=True)
    short = [{"role": "user", "content": "a short question"}]
    caller = threading.current_thread().name
    try:
        plan = r.plan(short)
        assert 0 < len(plan.hashes) <= INLINE_RECORD_BLOCKS
        r.started(r.replicas[0], plan)  # nothing queued: applied here, at once
        assert index.threads == [caller] and r.index.match(plan.hashes)["r0"] == len(plan.hashes)
        gate = threading.Event()
        index.record = lambda replica, hashes, _orig=index.record: (gate.wait(5), _orig(replica, hashes))[1]  # type: ignore[method-assign]
        long = r.plan(long_chat(1))
        r.started(r.replicas[1], long)  # a long chain: queued behind the gate
        r.started(
            r.replicas[1], r.plan([{"role": "user", "content": "another short one"}])
        )  # queued behind it, in order
        gate.set()
        r.settle()
        assert index.threads[1:] and all(name.startswith("kvgate-index") for name in index.threads[1:])
        assert len(index.threads) == 3
    finally:
        r.close()


def test_a_failed_attempt_records_no_answer():
    r = router(shared=True)
    msgs = chat(1)
    plan = r.plan(msgs)
    ticket = r.started(r.replicas[0], plan)
    hashes = r.answer_hashes(plan, [*msgs, {"role": "assistant", "content": "one thing " * 20}])
    assert hashes is not None
    r.finished(ticket, False, hashes)
    assert r.index.match(hashes)["r0"] == len(plan.hashes)  # the prompt's record only


def test_no_answer_hashing_when_answers_are_not_recorded():
    r = router(record_answers=False)
    msgs = chat(1)
    plan = r.plan(msgs)
    assert r.answer_hashes(plan, [*msgs, {"role": "assistant", "content": "x " * 40}]) is None


# ------------------------------------------------------------------ body parsing
@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "messages": [{"role": "user", "content": "caf\\u00e9 \\ud83d\\ude00 \xc3\xa9"}]}',
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": 123456789012345678901234567890}',
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0.30000000000000004, "top_p": 1e-7}',
        b'{"model": "m", "model": "n", "messages": [{"role": "user", "content": "x"}], "metadata": {"a": [null, true, -0]}}',
    ],
)
def test_fast_parse_equals_json(raw):
    assert _parse_body(raw, ChatCompletionRequest) == json.loads(raw)


# ------------------------------------------------------------------ through the proxy
def test_prompt_work_runs_on_the_event_loop_only_when_small(embedder, tmp_path):
    """A long prompt (or a long new turn) is rendered and tokenised in worker threads; a small one
    on the event loop, where the hops would cost more than the work (kvgate.middleware.cache.offload)."""
    replicas = [ServerThread(create_fake_app(Calls())).start() for _ in range(2)]
    config = parse_config(
        {
            "cache_dir": str(tmp_path / "cache"),
            "routes": [
                {
                    "name": "local",
                    "model": "smol*",
                    "backend": {"model": "openai/smollm2", "api_key": "none"},
                    "semantic": {"enabled": False},
                    "replicas": [{"name": f"r{i}", "api_base": f"{r.url}/v1"} for i, r in enumerate(replicas)],
                    "routing": {"prefix": {"tokenizer": "text", "block_size": 16}},
                }
            ],
        }
    )
    pipeline = build_pipeline(config, embedder=embedder)
    tok = Recording()
    pipeline.routers["local"].hasher.tokenizer = tok
    server = ServerThread(create_app(config, pipeline)).start()
    loop_thread = server.thread.name
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for stream in (False, True):
                msgs = [*chat(3), {"role": "assistant", "content": "hm"}, {"role": "user", "content": f"{stream}?"}]
                assert prompt_chars(msgs) < INLINE_NEW_CHARS
                big = [*msgs[:-1], {"role": "user", "content": f"long {stream} " + "y" * OFF_LOOP_BODY_BYTES}]
                # under the total bound, but a new turn past the text tokenizer's new-characters bound
                new_turn = [*msgs[:-1], {"role": "user", "content": f"new {stream} " + "z" * (2 * INLINE_NEW_CHARS)}]
                for body, on_loop in (
                    ({"model": "smollm2", "messages": msgs, "stream": stream}, True),
                    ({"model": "smollm2", "messages": big, "stream": stream}, False),
                    ({"model": "smollm2", "messages": new_turn, "stream": stream}, False),
                ):
                    before = len(tok.calls)
                    resp = client.post("/v1/chat/completions", json=body)
                    assert resp.status_code == 200, resp.text
                    assert resp.headers["x-kvgate-cache"] == "miss"
                    threads = {name for _, name in tok.calls[before:]}
                    assert threads == {loop_thread} if on_loop else (threads and loop_thread not in threads), threads
                    # a prompt's segments are rendered once, for its plan: prompt + answer only if a
                    # next turn comes (tests/test_pending_answers.py)
                    assert sum(1 for what, _ in tok.calls[before:] if what == "segments") == 1
            assert client.get("/health").status_code == 200
    finally:
        server.stop()
        pipeline.close()
        for r in replicas:
            r.stop()


def test_block_size_default_depends_on_tokenizer_and_mode():
    # text counts characters: 64 of them ≈ an engine's 16-token block, a quarter of the blocks to walk
    assert RoutingConfig().prefix.block_size == 64 and PrefixConfig(tokenizer="text").block_size == 64
    assert PrefixConfig(mode="precise").block_size is None  # precise: the engine's own, once it says
    assert PrefixConfig(mode="precise").tokenizer == "auto"
    assert PrefixConfig(tokenizer="smollm2").block_size is None  # the engine's, 16 until it says (mirror.py)
    assert (
        PrefixConfig(block_size=16).block_size == 16 and PrefixConfig(block_size=256, mode="precise").block_size == 256
    )


def test_a_record_after_close_is_applied_inline_not_raised():
    reps = [ReplicaConfig(name="r0", api_base="http://127.0.0.1:9000/v1")]
    r = Router(reps, RoutingConfig(prefix=PrefixConfig(tokenizer="text")), defer_records=True)
    plan = r.plan(chat(1))
    ticket = r.started(r.replicas[0], plan)
    r.close()  # the proxy shuts down while this request is still streaming
    r.finished(ticket, True, r.answer_hashes(plan, [*chat(1), {"role": "assistant", "content": "done " * 40}]))
    assert r.index.match(plan.hashes)["r0"] == len(plan.hashes)


class SlowIndex(PrefixIndex):
    """The real index, whose records wait for a gate (a recorder that has fallen behind)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.threads: list[str] = []

    def record(self, replica: str, hashes: Sequence[int], parent: int | None = None) -> list[int]:
        self.threads.append(threading.current_thread().name)
        if threading.current_thread().name.startswith("kvgate-index"):
            self.gate.wait(10)
        return super().record(replica, hashes, parent)


def test_a_recorder_behind_bounds_the_wait_and_the_queue(monkeypatch):
    import kvgate.middleware.routing.planner as planner_module
    import kvgate.middleware.routing.records as records_module

    monkeypatch.setattr(records_module, "MAX_PENDING_RECORDS", 4)
    reps = [ReplicaConfig(name=f"r{i}", api_base=f"http://127.0.0.1:{9000 + i}/v1") for i in range(2)]
    cfg = RoutingConfig(prefix=PrefixConfig(tokenizer="text", block_size=16))
    index = SlowIndex(cfg.prefix.capacity_blocks)
    r = Router(reps, cfg, index=index, defer_records=True)
    try:
        plans = [r.plan(long_chat(t)) for t in range(1, 8)]  # chains too long to skip the queue
        for plan in plans:
            r.started(r.replicas[0], plan)  # 4 queue behind the stuck recorder, 3 are applied inline
        assert index.threads.count("MainThread") == 3
        msgs = long_chat(9)
        waits: list[tuple[float | None, bool]] = []
        settle = r.records.settle
        monkeypatch.setattr(
            r.records,
            "settle",
            lambda timeout=None, chain=None: waits.append((timeout, settle(timeout, chain))) or waits[-1][1],
        )
        r.prepare(msgs)  # waits at most SETTLE_WAIT_S for the stuck records, then matches what is in
        assert waits == [(planner_module.SETTLE_WAIT_S, False)]  # a bounded wait, and it ran out
        assert not settle(0)  # prepare returned with the records still stuck: it did not wait for them
        assert r.plan(msgs).matched_blocks["r0"] > 0  # the inline records are seen
        # a prompt that starts otherwise shares no block with any queued chain: nothing to wait for
        other = [{"role": "system", "content": "Be verbose. " * 160}, *msgs[1:]]
        r.prepare(other)
        assert waits[-1] == (planner_module.SETTLE_WAIT_S, True) and not settle(0)
        index.gate.set()
        assert r.settle(5.0)
        assert sum(name.startswith("kvgate-index") for name in index.threads) == 4
    finally:
        index.gate.set()
        r.close()
