"""Answers noted at their finish and hashed by their conversation's next turn (a router that routes
alone): the next turn's match is the one a router recording answers at their finish makes, each
turn's text is rendered once, tenants' notes stay apart, and notes are bounded."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.index.kv.prompt import PromptHasher, message_runs, next_run
from kvgate.index.kv.tokenizer import TextTokenizer
from kvgate.middleware.config import PrefixConfig, ReplicaConfig, RoutingConfig
from kvgate.middleware.routing.pending_answers import AnswerNote, PendingAnswers
from kvgate.middleware.routing.router import Router
from kvgate.middleware.routing.state_local import LocalState

REPLICAS = [ReplicaConfig(name=f"r{i}", api_base=f"http://127.0.0.1:{9000 + i}/v1") for i in range(3)]


class Shared(LocalState):
    shared = True  # as WorkerState and RedisState: answers hashed and shared as they finish


class Counting(TextTokenizer):
    def __init__(self) -> None:
        self.rendered = 0

    def segments(self, messages: Any) -> list[str]:
        self.rendered += 1
        return super().segments(messages)


def router(shared: bool = False, defer: bool = False, **cfg: Any) -> Router:
    state = Shared([r.name for r in REPLICAS]) if shared else None
    prefix = PrefixConfig(tokenizer="text", block_size=16, **cfg)
    return Router(REPLICAS, RoutingConfig(prefix=prefix), state=state, defer_records=defer)


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "eps"]) for _ in range(words))


def serve(r: Router, messages: list[dict[str, Any]], replica: int, answer: str, prepare: bool, salt: str | None = None):
    """One turn: planned (after `prepare` when asked), sent to `replica`, answered."""
    if prepare:
        r.prepare(messages, salt)
    plan = r.plan(messages, salt=salt)
    ticket = r.started(r.replicas[replica], plan)
    r.finished(ticket, True, r.answer_hashes(plan, [*messages, {"role": "assistant", "content": answer}]))
    r.settle()
    return plan


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.booleans())
def test_a_next_turn_matches_what_a_router_recording_answers_at_their_finish_matches(seed, prepare):
    rng = random.Random(seed)
    noting, eager = router(defer=prepare), router(shared=True, defer=prepare)
    assert noting.planner.pending is not None and eager.planner.pending is None
    system = [{"role": "system", "content": text(rng, rng.randint(0, 60))}] if rng.random() < 0.7 else []
    talks = [[*system, {"role": "user", "content": text(rng, rng.randint(1, 40))}] for _ in range(3)]
    try:
        for _ in range(8):
            k = rng.randrange(len(talks))
            messages, replica, answer = talks[k], rng.randrange(3), text(rng, rng.randint(0, 50))
            a = serve(noting, messages, replica, answer, prepare)
            b = serve(eager, messages, replica, answer, prepare)
            assert a.hashes == b.hashes and a.matched_blocks == b.matched_blocks
            if rng.random() < 0.25:  # the conversation forks: a second next turn from the same answer
                talks.append([*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": "fork"}])
            talks[k] = [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": text(rng, 9)}]
    finally:
        noting.close()
        eager.close()


def test_an_answer_is_hashed_only_when_its_conversation_goes_on():
    r = router()
    tok = Counting()
    r.hasher.tokenizer = tok
    first = [{"role": "user", "content": "tell me about blocks " * 8}]
    answer = {"role": "assistant", "content": "blocks are chunks of tokens " * 6}
    plan = r.plan(first)
    ticket = r.started(r.replicas[1], plan)
    note = r.answer_hashes(plan, [*first, answer])
    assert isinstance(note, AnswerNote) and note.messages == 2
    r.finished(ticket, True, note)
    assert tok.rendered == 1  # the prompt, for its plan; the answer not yet
    conversation = PromptHasher(TextTokenizer(), 16).hashes([*first, answer])[0]
    assert r.index.match(conversation)["r1"] < len(conversation)  # not in the index yet
    nxt = r.plan([*first, answer, {"role": "user", "content": "and then?"}])
    assert r.index.match(conversation)["r1"] == len(conversation)  # recorded before the match
    # the match goes on past the prompt's blocks, into the answer's
    assert nxt.matched_blocks["r1"] > len(plan.hashes) + 1 and len(r.planner.pending) == 0


def test_a_failed_attempt_notes_nothing():
    r = router()
    messages = [{"role": "user", "content": "a question " * 10}]
    plan = r.plan(messages)
    ticket = r.started(r.replicas[0], plan)
    r.finished(ticket, False, r.answer_hashes(plan, [*messages, {"role": "assistant", "content": "half"}]))
    assert len(r.planner.pending) == 0


def test_a_tenants_note_is_never_taken_by_another_tenants_prompt():
    r = router()
    first = [{"role": "user", "content": "our quarterly numbers " * 6}]
    answer = "they are confidential " * 6
    serve(r, first, 2, answer, prepare=False, salt="tenant-a")
    nxt = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "more?"}]
    other = r.plan(nxt, salt="tenant-b")
    assert other.matched_blocks == {"r0": 0, "r1": 0, "r2": 0} and len(r.planner.pending) == 1
    assert r.plan(nxt, salt="tenant-a").matched_blocks["r2"] > 0 and len(r.planner.pending) == 0


def test_a_route_sharing_its_state_hashes_answers_at_their_finish():
    r = router(shared=True)
    messages = [{"role": "user", "content": "a question " * 10}]
    plan = r.plan(messages)
    assert isinstance(r.answer_hashes(plan, [*messages, {"role": "assistant", "content": "yes"}]), list)


def test_notes_are_bounded_taken_once_and_leave_with_their_replica():
    pending = PendingAnswers(size=2)
    convs = [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}] for i in range(3)]
    for i, conv in enumerate(convs):
        pending.note(f"r{i}", AnswerNote(message_runs(conv)[-1], 2, None))
    assert len(pending) == 2  # the oldest went
    assert pending.take(None, message_runs([*convs[0], {"role": "user", "content": "?"}])) == []
    runs = message_runs([*convs[1], {"role": "user", "content": "?"}])
    assert pending.take("salted", runs) == [] and pending.take(None, runs) == [("r1", 2)]
    assert pending.take(None, runs) == []  # once
    pending.forget("r2")
    assert len(pending) == 0
    with pytest.raises(ValueError):
        PendingAnswers(size=0)


def test_a_removed_replica_gets_no_late_record():
    r = router()
    first = [{"role": "user", "content": "a question " * 10}]
    serve(r, first, 1, "an answer " * 10, prepare=False)
    r.remove_replica("r1")
    assert len(r.planner.pending) == 0
    r.plan([*first, {"role": "assistant", "content": "an answer " * 10}, {"role": "user", "content": "next"}])
    assert "r1" not in r.index.replicas


@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", None]), st.text(max_size=20)), max_size=6))
def test_next_run_extends_message_runs_by_one_message(pairs):
    messages = [{"content": text} if role is None else {"role": role, "content": text} for role, text in pairs]
    runs, run = message_runs(messages), 0
    for k, message in enumerate(messages):
        run = next_run(run, message)
        assert run == runs[k]
