"""A long new message is matched on a lead of it: only its first characters are tokenised before
the routing decision when their blocks already stop the match, and `complete()` tokenises it
whole. The result must be what an eager call gives (hashes, token count, cached chain states),
the lead's ids must be how the whole message begins (held to the packaged SmolLM2 tokenizer over
generated text), and a lead that is not turns leads off for the hasher."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.index.kv.hashing import pack_tokens
from kvgate.index.kv.prompt import LEAD_CHARS_PER_TOKEN, STOP_CHECK_TOKENS, PromptHasher
from kvgate.index.kv.tokenizer import TextTokenizer, load_tokenizer
from kvgate.index.kv.tokenizer_light import LEAD_MARGIN_CHARS, lead_ids
from kvgate.middleware.routing import records as records_module
from kvgate.middleware.routing.records import MAX_PENDING_RECORDS, Records
from kvgate.middleware.routing.state_local import LocalState
from tests.test_records_settle import GatedIndex, chain

BS = 16
STRETCH = STOP_CHECK_TOKENS // BS
LEAD = LEAD_CHARS_PER_TOKEN * (STRETCH + 1) * BS


class Leading(TextTokenizer):
    """Code points as tokens (so ids are easy to reason about), but with a model tokenizer's
    costs: memoised, a lead on request (`wrong`: a lead that is not the segment's start)."""

    backend = "fake"
    name = "leading"

    def __init__(self, wrong: bool = False) -> None:
        self.wrong = wrong
        self.whole: list[tuple[int, str]] = []  # (length, thread name) of each whole encode
        self.leads = 0

    def packed(self, segment: str) -> bytes:
        self.whole.append((len(segment), threading.current_thread().name))
        return super().packed(segment)

    def packed_lead(self, segment: str, chars: int) -> bytes | None:
        if len(segment) <= chars + LEAD_MARGIN_CHARS:
            return None
        self.leads += 1
        head = segment[: chars - LEAD_MARGIN_CHARS]
        return super().packed(head.upper() if self.wrong else head)


def long_chat(words: int = 3000) -> list[dict[str, Any]]:
    body = " ".join(f"word{i % 97}" for i in range(words))
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": body}]


def refuse_all(_: int) -> bool:
    return False


def test_a_long_new_message_is_matched_on_its_lead_and_completed_whole():
    msgs = long_chat()
    eager = PromptHasher(TextTokenizer(), BS).prompt(msgs)
    tok = Leading()
    hasher = PromptHasher(tok, BS)
    lazy = hasher.prompt(msgs, until=refuse_all)
    assert tok.leads == 1 and all(n < LEAD for n, _ in tok.whole)  # the long message: only its lead
    assert lazy.partial and lazy.untokenized
    assert lazy.hashes == eager.hashes[: len(lazy.hashes)] and 0 < len(lazy.hashes) <= STRETCH + 1
    assert lazy.tokens == pytest.approx(eager.tokens, rel=0.1)  # estimated from the lead
    lazy.complete()
    assert not lazy.partial and not lazy.untokenized
    assert (lazy.hashes, lazy.tokens, lazy.states) == (eager.hashes, eager.tokens, eager.states)
    assert hasher.uncached_chars(msgs) == 0
    tok.whole.clear()
    assert hasher.prompt(msgs, until=refuse_all).hashes == eager.hashes  # resumed from the cache
    assert tok.whole == [] and tok.leads == 1


def test_a_lead_whose_blocks_are_all_held_falls_back_to_the_whole_message():
    msgs = long_chat()
    eager = PromptHasher(TextTokenizer(), BS).prompt(msgs)
    tok = Leading()
    got = PromptHasher(tok, BS).prompt(msgs, until=set(eager.hashes).__contains__)
    assert tok.leads == 1 and not got.partial
    assert (got.hashes, got.tokens) == (eager.hashes, eager.tokens)


def test_messages_after_a_stop_wait_as_text_when_long_and_the_estimate_learns():
    msgs = [*long_chat(), {"role": "assistant", "content": "ok"}, {"role": "user", "content": "x" * (3 * LEAD)}]
    eager = PromptHasher(TextTokenizer(), BS).prompt(msgs)
    tok = Leading()
    hasher = PromptHasher(tok, BS)
    lazy = hasher.prompt(msgs, until=refuse_all)
    assert tok.leads == 1 and max(n for n, _ in tok.whole) < LEAD  # neither long message whole
    lazy.complete()
    assert (lazy.hashes, lazy.tokens) == (eager.hashes, eager.tokens)
    # another system prompt: the long message's ids come from the cache, and hashing stops in it;
    # the new long message after it is estimated at what complete() measured (one token a character)
    other = [{"role": "system", "content": "Be long."}, *msgs[1:-1], {"role": "user", "content": "y" * (3 * LEAD)}]
    leads = tok.leads
    again = hasher.prompt(other, until=refuse_all)
    assert tok.leads == leads and again.untokenized
    assert again.tokens == PromptHasher(TextTokenizer(), BS).prompt(other).tokens


def test_a_lead_that_is_not_how_the_message_begins_turns_leads_off(caplog):
    msgs = long_chat()
    eager = PromptHasher(TextTokenizer(), BS).prompt(msgs)
    tok = Leading(wrong=True)
    hasher = PromptHasher(tok, BS)
    lazy = hasher.prompt(msgs, until=refuse_all)
    assert lazy.hashes != eager.hashes[: len(lazy.hashes)]  # routed on wrong hashes: a worse route at most
    with caplog.at_level(logging.WARNING, logger="kvgate.router"):
        lazy.complete()
    assert lazy.hashes == eager.hashes  # what is recorded is exact
    assert "tokenised whole from now on" in caplog.text
    again = [*msgs[:-1], {"role": "user", "content": msgs[-1]["content"] + " more"}]
    hasher.prompt(again, until=refuse_all)
    assert tok.leads == 1  # no lead asked for since


def test_a_record_with_text_to_tokenise_always_goes_to_the_recorder():
    """Past MAX_PENDING_RECORDS queued, a caller applies its own record inline; not one whose
    prompt still has a long message to tokenise: that one queues, and the recorder tokenises it."""
    index = GatedIndex(100_000)
    index.add_replica("r0")
    records = Records(index, LocalState(["r0"]), deferred=True)
    tok = Leading()
    try:
        for i in range(MAX_PENDING_RECORDS):  # the queue full, held at the gate
            records.record("r0", chain(i + 1))
        lazy = PromptHasher(tok, BS).prompt(long_chat(), until=refuse_all)
        records.record("r0", lazy)
        assert lazy.untokenized  # queued, not tokenised on this thread
        index.gate.set()
        assert records.settle(10.0)
        assert not lazy.untokenized
        assert [name for n, name in tok.whole if n > LEAD] == ["kvgate-index_0"]
        assert index.match(lazy.hashes)["r0"] == len(lazy.hashes)
    finally:
        index.gate.set()
        records.close()


# ------------------------------------------------------------------ the packaged SmolLM2 tokenizer
@pytest.fixture(scope="module")
def smollm2():
    return load_tokenizer("smollm2")


PIECES = st.sampled_from(
    ["the", " quick", " brown", "  ", "\n", "\n\n", "\t", "123", "4567", ",", ".", "!?", "é", "的", "は", "😀",
     "def f(x):", " {", "}", "    ", "'s", " don't", "http://a.b/c", "__init__", "ÅÄÖ", "\u00a0", "-", "--"]
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(PIECES, min_size=200, max_size=1200), chars=st.integers(min_value=80, max_value=3000))
def test_smollm2_lead_ids_begin_the_whole_encoding(smollm2, pieces, chars):
    text = "".join(pieces)
    ids = lead_ids(smollm2._rust, text, chars)  # noqa: SLF001  (the fast tokenizer the hasher's lead uses)
    whole = smollm2.encode(text)
    assert whole[: len(ids)] == ids
    if len(text) > chars + LEAD_MARGIN_CHARS:
        assert ids  # a lead, unless the text is too short to need one
    lead = smollm2.packed_lead(text, chars)
    assert lead is None or pack_tokens(whole).startswith(lead)


def test_smollm2_prompt_from_a_lead_completes_to_the_eager_prompt(smollm2):
    msgs = long_chat(4000)
    eager = PromptHasher(smollm2, BS).prompt(msgs)
    lazy = PromptHasher(smollm2, BS).prompt(msgs, until=refuse_all)
    assert lazy.untokenized and lazy.hashes == eager.hashes[: len(lazy.hashes)]
    assert lazy.complete().hashes == eager.hashes and lazy.tokens == eager.tokens


def test_engine_sized_blocks_are_checked_after_as_many_tokens():
    """With 128-token blocks (vLLM's on CPUs) a stretch is two blocks: a fresh 8k-character
    message is matched on a lead of it too."""
    msgs = long_chat(1300)
    eager = PromptHasher(TextTokenizer(), 128).prompt(msgs)
    hasher = PromptHasher(Leading(), 128)
    assert hasher.stretch == STOP_CHECK_TOKENS // 128
    lazy = hasher.prompt(msgs, until=refuse_all)
    assert lazy.untokenized and 0 < len(lazy.hashes) <= hasher.stretch + 1
    assert lazy.complete().hashes == eager.hashes and lazy.tokens == eager.tokens


def test_past_its_bound_a_record_still_to_tokenise_is_dropped(monkeypatch, caplog):
    """Such records always queue (the caller does not tokenise); past MAX_PENDING_COSTLY queued
    one is dropped instead, so the queue stays bounded, and a warning says so."""
    monkeypatch.setattr(records_module, "MAX_PENDING_COSTLY", 2)
    index = GatedIndex(100_000)
    index.add_replica("r0")
    records = Records(index, LocalState(["r0"]), deferred=True)
    try:
        records.record("r0", chain(1))
        records.record("r0", chain(2))  # two queued behind the gate
        lazy = PromptHasher(Leading(), BS).prompt(long_chat(), until=refuse_all)
        with caplog.at_level(logging.WARNING, logger="kvgate.router"):
            records.record("r0", lazy)
        assert records.dropped == 1 and "records of new long prompts are dropped" in caplog.text
        index.gate.set()
        assert records.settle(10.0)
        assert lazy.untokenized and index.match(lazy.hashes)["r0"] == 0  # neither tokenised nor recorded
    finally:
        index.gate.set()
        records.close()
