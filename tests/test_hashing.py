"""Chained block hashing: the properties prefix routing relies on."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.index.kv.hashing import (
    block_hashes,
    common_prefix_len,
    digests_to_hashes,
    hash_block,
    pack_tokens,
    packed_block_digests,
    seed_hash,
    unpack_tokens,
)
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import TextTokenizer

tokens = st.lists(st.integers(0, 2**32 - 1), max_size=200)


@settings(max_examples=300, deadline=None)
@given(tokens, tokens, st.integers(1, 16))
def test_equal_prefixes_iff_equal_leading_hashes(a, b, bs):
    ha, hb = block_hashes(a, bs), block_hashes(b, bs)
    shared_tokens = common_prefix_len(a, b)
    # leading hashes agree exactly for the full blocks inside the shared token prefix
    assert common_prefix_len(ha, hb) == min(shared_tokens // bs, len(ha), len(hb))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50000), min_size=1, max_size=200), st.integers(1, 16), st.data())
def test_change_at_t_changes_every_hash_from_its_block_on(toks, bs, data):
    t = data.draw(st.integers(0, len(toks) - 1))
    changed = list(toks)
    changed[t] = toks[t] + 1
    before, after = block_hashes(toks, bs), block_hashes(changed, bs)
    first = t // bs
    assert before[:first] == after[:first]
    assert all(x != y for x, y in zip(before[first:], after[first:]))


@settings(max_examples=100, deadline=None)
@given(tokens, tokens, st.integers(1, 8))
def test_resume_from_parent(a, b, bs):
    a = a[: len(a) // bs * bs]
    head = block_hashes(a, bs)
    tail = block_hashes(b, bs, parent=head[-1] if head else None)
    assert block_hashes(a + b, bs) == head + tail


@settings(max_examples=100, deadline=None)
@given(tokens, st.integers(1, 8), st.lists(st.text(max_size=3), max_size=2))
def test_block_hashes_is_a_fold_of_hash_block(toks, bs, extra):
    h, expected = seed_hash(), []
    for i in range(len(toks) // bs):
        h = hash_block(h, toks[i * bs : (i + 1) * bs], extra)
        expected.append(h)
    assert block_hashes(toks, bs, extra=extra) == expected


def test_only_full_blocks_extra_keys_and_seed():
    assert len(block_hashes(list(range(47)), 16)) == 2
    assert block_hashes([1] * 16, 16, extra=("lora-a",)) != block_hashes([1] * 16, 16)
    assert block_hashes([1] * 16, 16, seed="other") != block_hashes([1] * 16, 16)
    assert hash_block(seed_hash(), [1, 2]) != hash_block(seed_hash(), [2, 1])


def test_hashes_are_the_ones_earlier_versions_wrote():
    """Chunks on disk and in Redis are keyed by these: the scheme must never drift."""
    assert block_hashes(list(range(64)), 16) == [
        6877071744155751715,
        8223139665013800787,
        17151805118127067295,
        16759691945055215955,
    ]
    text = [ord(c) for c in "héllo wörld, 🙂 twenty-four chars!"]
    assert block_hashes(text, 8, extra=("m", 3)) == [
        3148698562844123075,
        15979847942193214104,
        15142781145999798721,
        15742930476255675572,
    ]


@settings(max_examples=200, deadline=None)
@given(
    tokens,
    st.integers(1, 16),
    st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    st.lists(st.text(max_size=3), max_size=2),
)
def test_packed_digests_are_block_hashes(toks, bs, parent, extra):
    assert unpack_tokens(pack_tokens(toks)) == toks
    digests = packed_block_digests(pack_tokens(toks), bs, parent, extra)
    assert len(digests) == 8 * (len(toks) // bs)
    assert digests_to_hashes(digests) == block_hashes(toks, bs, parent, extra)
    if parent is not None:  # a parent given as its digest is the same parent
        assert packed_block_digests(pack_tokens(toks), bs, parent.to_bytes(8, "little"), extra) == digests


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=1, max_size=6), st.integers(1, 12))
def test_prompt_hashes_are_block_hashes_of_the_prompts_tokens(turns, bs):
    """However much of a conversation the hasher resumes from, its hashes are the full computation's."""
    hasher = PromptHasher(TextTokenizer(), bs)
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    for k in range(1, len(messages) + 1):  # the conversation growing turn by turn
        out = hasher.prompt(messages[:k])
        ids = [ord(c) for c in "".join(TextTokenizer().segments(messages[:k]))]
        assert hasher.tokens(messages[:k]) == ids
        assert out.hashes == block_hashes(ids, bs) and out.tokens == len(ids)


def test_stable_across_processes():
    code = "from kvgate.index.kv.hashing import block_hashes; print(block_hashes(list(range(64)), 16))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
        cwd=__file__.rsplit("/tests/", 1)[0],
    )
    assert out.stdout.strip() == str(block_hashes(list(range(64)), 16))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<|im_start|>", "<|im_end|>", "a", "b\n", "é", "<|im"]), max_size=30))
def test_chat_segments_split_before_each_boundary_keeping_it(pieces):
    """HFChatTokenizer.segments: the rendered text cut before every boundary token, which starts
    the next segment; no empty segment; joined they give the text back."""
    import re

    from kvgate.index.kv.tokenizer import HFChatTokenizer

    class Rendered:
        all_special_tokens = ["<|im_start|>", "<|im_end|>"]

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return messages[0]["content"]

    text = "".join(pieces)
    segments = HFChatTokenizer(Rendered(), "t").segments([{"role": "user", "content": text}])
    assert segments == [s for s in re.split("(?=<\\|im_start\\|>)", text) if s]
    assert "".join(segments) == text


def test_chat_tokenizer_encode_matches_the_tokenizers_own_call():
    """HFChatTokenizer.encode takes the Rust tokenizer's encode directly: the same ids as
    transformers' __call__ without special tokens, on chat pieces, unicode and long text."""
    from kvgate.index.kv.tokenizer import load_tokenizer

    tok = load_tokenizer("smollm2")
    assert tok._rust is not None
    for text in [
        "<|im_start|>user\nwhat about é, 日本語 and emoji 🙂?<|im_end|>\n",
        "<|im_start|>assistant\n",
        " leading space",
        "",
        "tabs\tand\nnewlines  ",
        "word and more " * 500,
    ]:
        assert tok.encode(text) == list(tok._tok(text, add_special_tokens=False)["input_ids"])


@given(st.text(min_size=1, max_size=300), st.integers(1, 9), st.sampled_from([None, "tenant-salt"]))
@settings(max_examples=60, deadline=None)
def test_completions_prompts_hash_their_own_tokens(text, bs, salt):
    """A completions prompt hashes as the engine's tokens of the raw text (no template) or the ids
    as given, under the same salt rule as chat; text, ids and chat never share a chain state."""
    from kvgate.index.kv.hashing import salted_seed, text_tokens
    from kvgate.index.kv.prompt import PromptHasher, TextPrompt
    from kvgate.index.kv.tokenizer import TextTokenizer

    hasher = PromptHasher(TextTokenizer(), bs)
    tokens = text_tokens(text)
    expected = block_hashes(tokens, bs, seed=salted_seed(hasher.seed, salt))
    by_text = hasher.prompt(TextPrompt(text), salt=salt)
    assert (by_text.hashes, by_text.tokens) == (expected, len(tokens))
    by_ids = hasher.prompt(TextPrompt(token_ids=tuple(tokens)), salt=salt)
    assert (by_ids.hashes, by_ids.tokens) == (expected, len(tokens))
    # the chat rendering of the same text is another prompt
    chat = hasher.prompt([{"role": "user", "content": text}], salt=salt)
    assert chat.tokens > len(tokens)
    assert hasher.prompt(TextPrompt(text), salt=salt).hashes == expected  # again, from the caches
