"""Precise mode's tokenizers let other threads run while they tokenize: the proxy hashes a long
prompt on a worker thread so that its event loop keeps serving, and a tokenizer call that held
the GIL throughout would stop the loop for as long as it ran. Both tokenizer backends, SmolLM2's
files, the same ids as the fast tokenizer's own `encode`."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.index.kv.tokenizer import load_tokenizer, smollm2_tokenizer_dir
from kvgate.index.kv.tokenizer_light import encode_ids

WORDS = "The quick brown fox jumps over the lazy dog, and then some more words follow here. "


@pytest.fixture(scope="module")
def files():
    try:
        return smollm2_tokenizer_dir()
    except (FileNotFoundError, ModuleNotFoundError) as exc:  # `make install` converts it
        pytest.skip(f"SmolLM2's tokenizer files are not prepared: {exc}")


@pytest.fixture(scope="module")
def rust(files):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(files / "tokenizer.json"))


@pytest.mark.parametrize("backend", ["tokenizers", "transformers"])
def test_the_ids_are_the_fast_tokenizers_own(files, backend):
    from tokenizers import Tokenizer

    rust = Tokenizer.from_file(str(files / "tokenizer.json"))
    tok = load_tokenizer(str(files), backend=backend)
    for text in ("", "hi", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n", WORDS * 40, "naïve café ☕ 日本語"):
        assert tok.encode(text) == rust.encode(text, add_special_tokens=False).ids
        assert encode_ids(rust, text, True) == rust.encode(text, add_special_tokens=True).ids


PIECES = st.sampled_from(["<|im_start|>", "<|im_end|>", "user\n", "  ", "\n\n", "123", "é", "日本", "🙂", " the"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=40), PIECES), max_size=12), st.booleans())
def test_any_text_gets_the_ids_plain_encode_gives(rust, parts, special):
    """The call that leaves out the character offsets gives the ids `encode` gives: any text,
    special tokens and digits and multi-byte characters among it, with and without the
    tokenizer's own special tokens added."""
    text = "".join(parts)
    assert encode_ids(rust, text, special) == rust.encode(text, add_special_tokens=special).ids


def test_another_thread_runs_while_a_long_text_is_tokenized(files):
    """A thread stamps the time every millisecond, which it can only do while it holds the GIL; a
    stamp well inside the tokenizer call (away from its ends by more than a switch interval) shows
    the call let the GIL go. With the fast tokenizer's plain `encode` no stamp lands inside."""
    from tokenizers import Tokenizer

    rust = Tokenizer.from_file(str(files / "tokenizer.json"))
    text = WORDS * 4000  # ~70k tokens: about a tenth of a second per call
    stamps: list[float] = []
    stop = threading.Event()

    def spin() -> None:  # a stamp a millisecond; each needs the GIL
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0.001)

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    inside = []
    try:
        for _ in range(5):
            start = time.perf_counter()
            encode_ids(rust, text, False)
            end = time.perf_counter()
            margin = max(0.02, (end - start) / 5)
            inside.append(sum(start + margin < t < end - margin for t in list(stamps)))
            if inside[-1]:
                break
    finally:
        stop.set()
        spinner.join()
    assert max(inside) > 0, f"the spinner never ran inside a tokenizer call ({inside})"
