"""The prompt hasher's SHA-256 loops: the C extension gives what the Python loops give (segment
digests of any text or bytes, chain digests of any packed tokens, settings and cuts); it is built
wherever a C compiler and OpenSSL's headers are; bad arguments raise, never crash; and a prompt
hasher on either gives the same hashes as a full recomputation, turn after turn."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sysconfig
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.index.kv.hash_loops import loops, python_loops
from kvgate.index.kv.hashing import block_hashes, extra_prefix
from kvgate.index.kv.prompt import PromptHasher, TextPrompt
from kvgate.index.kv.tokenizer import load_tokenizer

PY = python_loops()
ROOT = hashlib.sha256(b"root").digest()


def buildable() -> bool:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"], "Python.h").exists()
    return shutil.which(cc) is not None and headers and Path("/usr/include/openssl/sha.h").exists()


@pytest.fixture(scope="module")
def native() -> ModuleType:
    mod = loops()
    if mod is PY:
        if buildable():
            pytest.fail("a C compiler and OpenSSL's headers are here but kvgate.index.kv._hash_loops was not built")
        pytest.skip("no C compiler or no OpenSSL headers: the Python loops are the only ones")
    return mod


def test_the_extension_is_built_where_it_can_be() -> None:
    if not buildable():
        pytest.skip("no C compiler or no OpenSSL headers here")
    assert loops() is not PY


materials = st.lists(st.one_of(st.text(max_size=300), st.binary(max_size=300)), max_size=6)


@settings(max_examples=300, deadline=None)
@given(materials=materials, root=st.binary(min_size=32, max_size=32))
def test_segment_digests_are_the_pythons(native: ModuleType, materials: list, root: bytes) -> None:
    try:
        want = PY.segment_digests(root, materials)
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 for it, in either
        with pytest.raises(UnicodeEncodeError):
            native.segment_digests(root, materials)
        return
    assert native.segment_digests(root, materials) == want
    assert native.segment_digests(root, tuple(materials)) == want


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=3000),
    block_size=st.integers(1, 40),
    cut=st.integers(0, 50),
    parent=st.binary(min_size=8, max_size=8),
    extra=st.lists(st.one_of(st.text(max_size=10), st.integers(0, 10**6)), max_size=3),
)
def test_chain_digests_are_the_pythons(native, data: bytes, block_size: int, cut: int, parent: bytes, extra) -> None:
    step, prefix = 4 * block_size, extra_prefix(extra)
    for packed in (data, memoryview(data)[cut:], bytearray(data)):
        assert native.chain_digests(packed, step, parent, prefix) == PY.chain_digests(packed, step, parent, prefix)


def test_long_chains_that_free_the_gil_are_the_pythons(native) -> None:
    packed = os.urandom(64 * 1000 + 17)
    assert native.chain_digests(packed, 64, b"p" * 8, extra_prefix(["m"])) == PY.chain_digests(
        packed, 64, b"p" * 8, extra_prefix(["m"])
    )


@pytest.mark.parametrize("mod", ["python", "c"])
def test_bad_arguments_raise(mod: str, native: ModuleType) -> None:
    impl = PY if mod == "python" else native
    with pytest.raises(ValueError):
        impl.segment_digests(b"short", ["a"])
    with pytest.raises(TypeError):
        impl.segment_digests(ROOT, [3])
    with pytest.raises(ValueError):
        impl.chain_digests(b"x" * 64, 0, b"p" * 8, b"")
    with pytest.raises(ValueError):
        impl.chain_digests(b"x" * 64, 64, b"p" * 7, b"")
    with pytest.raises(TypeError):
        impl.chain_digests("t" * 64, 64, b"p" * 8, b"")


def _conversations(seed: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    words = ["a", "bé", "ç", "日本", "token", "\n", "😀", "x" * 30]
    out = []
    for _ in range(6):
        messages = [{"role": "system", "content": " ".join(rng.choices(words, k=rng.randint(0, 200)))}]
        for _ in range(rng.randint(1, 4)):
            messages = messages + [{"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(1, 80)))}]
            out.append(messages)
            messages = messages + [{"role": "assistant", "content": " ".join(rng.choices(words, k=rng.randint(1, 40)))}]
    return out


@pytest.mark.parametrize("seed", range(4))
def test_a_hasher_on_either_loops_gives_a_full_recomputations_hashes(native, seed: int) -> None:
    tokenizer = load_tokenizer("text")
    hashers = [PromptHasher(tokenizer, 16, extra=["m"], hash_loops=impl) for impl in (PY, native)]
    for messages in _conversations(seed):
        ids = tokenizer.segments(messages)
        full = block_hashes([ord(c) for c in "".join(ids)], 16, extra=["m"])
        plans = [h.prompt(messages, until=lambda _: seed % 2 == 0) for h in hashers]
        for hasher, plan in zip(hashers, plans):
            assert plan.complete().hashes == full
            answered = hasher.prompt([*messages, {"role": "assistant", "content": "ok"}], plan)
            assert answered.hashes == hashers[0].prompt([*messages, {"role": "assistant", "content": "ok"}]).hashes
        text = TextPrompt("".join(ids))
        assert hashers[0].prompt(text).hashes == hashers[1].prompt(text).hashes


def test_a_router_without_the_c_hash_loops_says_so(caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    import logging

    from kvgate.middleware.config import ReplicaConfig, RoutingConfig
    from kvgate.middleware.routing import router

    reps = [ReplicaConfig(name="a", api_base="http://a/v1")]
    monkeypatch.setattr(router, "native_hashing", lambda: False)
    with caplog.at_level(logging.WARNING, logger="kvgate.router"):
        router.Router(reps, RoutingConfig(), name="slow").close()
    said = [r.getMessage() for r in caplog.records if "_hash_loops" in r.getMessage()]
    assert len(said) == 1 and "route slow" in said[0] and "OpenSSL" in said[0]
