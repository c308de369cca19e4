"""Which requests' cache work runs on the event loop (kvgate.middleware.cache.offload), and the estimate of a
prompt's new characters it reads (PromptHasher.uncached_chars)."""

from __future__ import annotations

import threading

import httpx
import pytest

from kvgate.engines.demo import Calls, create_fake_app
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import TextTokenizer
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.cache.offload import (
    INLINE_NEW_CHARS,
    INLINE_TOTAL_CHARS,
    new_chars_limit,
    prompt_chars,
    runs_inline,
)
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import ServerThread
from tests.conftest import one_replica_config


def test_prompt_chars_counts_text_and_refuses_what_is_not_messages():
    msgs = [
        {"role": "system", "content": "abc"},
        {"role": "user", "content": [{"type": "text", "text": "de"}, {"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "assistant", "content": None},
    ]
    assert prompt_chars(msgs) == 5
    assert prompt_chars([]) == 0
    assert prompt_chars([{"role": "user", "content": "héllo"}, {"role": "assistant", "content": ""}]) == 5
    assert prompt_chars([{"role": "user", "content": "abc"}, {"role": "assistant"}]) == 3  # no content: none counted
    assert prompt_chars("hello") == -1 and prompt_chars(None) == -1 and prompt_chars([{"role": "user"}, "x"]) == -1


def test_limits_never_inline_what_may_wait_on_the_network_or_embed():
    assert new_chars_limit(local_stores=False, semantic=False, tokenizer="text") is None
    assert new_chars_limit(local_stores=True, semantic=True, tokenizer=None) is None
    assert new_chars_limit(local_stores=True, semantic=False, tokenizer=None) == INLINE_TOTAL_CHARS
    assert new_chars_limit(local_stores=True, semantic=False, tokenizer="text") == INLINE_NEW_CHARS
    assert new_chars_limit(local_stores=True, semantic=False, tokenizer="smollm2") == INLINE_NEW_CHARS
    assert runs_inline(100, 100, INLINE_NEW_CHARS) and not runs_inline(100, 100, None)
    # a long prompt hops even when almost all of it was hashed before
    assert not runs_inline(INLINE_TOTAL_CHARS + 1, 10, INLINE_NEW_CHARS)
    assert not runs_inline(9000, INLINE_NEW_CHARS + 1, INLINE_NEW_CHARS)


def test_uncached_chars_counts_only_what_follows_the_longest_run_hashed_before():
    hasher = PromptHasher(TextTokenizer(), 16)
    system = {"role": "system", "content": "s" * 500}
    first = [system, {"role": "user", "content": "q" * 40}]
    assert hasher.uncached_chars(first) == 540  # nothing seen: all of it
    hasher.prompt(first)
    assert hasher.uncached_chars(first) == 0
    # the next turn: only the answer and the new question are new
    nxt = [*first, {"role": "assistant", "content": "a" * 30}, {"role": "user", "content": "r" * 7}]
    assert hasher.uncached_chars(nxt) == 37
    # prompt + answer hashed (the router's record_answers): then only the new question
    hasher.prompt(nxt[:3])
    assert hasher.uncached_chars(nxt) == 7
    # another conversation sharing the system prompt resumes after it
    assert hasher.uncached_chars([system, {"role": "user", "content": "z" * 9}]) == 9
    # a changed system prompt shares nothing, even with the same later messages
    assert hasher.uncached_chars([{"role": "system", "content": "t" * 500}, *nxt[1:]]) == 500 + 40 + 30 + 7
    # the role is part of a message's identity
    assert hasher.uncached_chars([{"role": "user", "content": "s" * 500}]) == 500


def test_uncached_chars_forgets_with_the_hashers_caches():
    hasher = PromptHasher(TextTokenizer(), 16, cache_size=2)
    hasher.prompt([{"role": "user", "content": "a" * 10}])
    for i in range(3):
        hasher.prompt([{"role": "user", "content": f"other {i}"}])
    assert hasher.uncached_chars([{"role": "user", "content": "a" * 10}]) == 10


@pytest.mark.parametrize("store_semantic", [False, True])
def test_inline_and_offloaded_requests_give_the_same_cache_behaviour(embedder, tmp_path, store_semantic):
    """Through the proxy: a small request (inline on an exact-only route) and a long one (in
    worker threads) both miss, store, and hit on repeat; on a semantic route even the small one
    hops (its lookup embeds)."""
    replica = ServerThread(create_fake_app(Calls())).start()
    config = one_replica_config(
        tmp_path / "cache",
        replica.url,
        semantic={"enabled": store_semantic, "threshold": 0.98},
        routing={"prefix": {"tokenizer": "text"}},
    )
    pipeline = build_pipeline(config, embedder=embedder)
    threads: list[str] = []
    look_up = pipeline.cache.look_up

    def noting(*args, **kwargs):  # the real step, noting the thread it ran on
        threads.append(threading.current_thread().name)
        return look_up(*args, **kwargs)

    pipeline.cache.look_up = noting  # type: ignore[method-assign]
    server = ServerThread(create_app(config, pipeline)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            # (content, first request inline?, its repeat inline?): a repeat of a long new turn is
            # hashed already, so only a prompt past the total bound hops twice
            cases = (
                ("a small question?", True, True),
                ("a long new turn " + "x" * (2 * INLINE_NEW_CHARS), False, True),
                ("a prompt past the total bound " + "y" * INLINE_TOTAL_CHARS, False, False),
            )
            for content, first_inline, again_inline in cases:
                for stream in (False,) if store_semantic else (False, True):  # semantic: one variant, or it hits
                    body = {
                        "model": "smollm2",
                        "stream": stream,
                        "messages": [{"role": "user", "content": f"{content} {stream}"}],
                    }
                    first, again = (
                        client.post("/v1/chat/completions", json=body),
                        client.post("/v1/chat/completions", json=body),
                    )
                    assert first.status_code == again.status_code == 200, first.text
                    assert first.headers["x-kvgate-cache"] == "miss" and again.headers["x-kvgate-cache"] == "exact"
                    if not stream:
                        assert (
                            again.json()["choices"][0]["message"]["content"]
                            == first.json()["choices"][0]["message"]["content"]
                        )
                    on_loop = [name == server.thread.name for name in threads[-2:]]
                    # a semantic route's lookup embeds: it always hops
                    assert on_loop == [first_inline and not store_semantic, again_inline and not store_semantic], (
                        threads[-2:]
                    )
        assert pipeline.routers["r"].index.stats()  # the router learnt from both kinds
    finally:
        server.stop()
        pipeline.close()
        replica.stop()


def test_a_long_answer_to_a_small_prompt_is_recorded_off_the_loop(embedder, tmp_path):
    """The record step hashes the answer after the prompt (the router's records): an answer past
    the new-characters bound sends it to a worker thread, though the lookup ran inline."""
    replica = ServerThread(create_fake_app(Calls())).start()
    config = one_replica_config(
        tmp_path / "cache", replica.url, semantic={"enabled": False}, routing={"prefix": {"tokenizer": "text"}}
    )
    pipeline = build_pipeline(config, embedder=embedder)
    steps: list[tuple[str, str]] = []
    for name in ("look_up", "record"):
        real = getattr(pipeline.cache, name)

        def noting(*args, _real=real, _name=name, **kwargs):  # the real step, noting its thread
            steps.append((_name, threading.current_thread().name))
            return _real(*args, **kwargs)

        setattr(pipeline.cache, name, noting)
    server = ServerThread(create_app(config, pipeline)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for stream in (False, True):
                for size, record_inline in ((0, True), (3 * INLINE_NEW_CHARS, False)):
                    steps.clear()
                    body = {
                        "model": "smollm2",
                        "stream": stream,
                        "messages": [{"role": "user", "content": f"tell me more [[long={size}]] {stream}"}],
                    }
                    resp = client.post("/v1/chat/completions", json=body)
                    assert resp.status_code == 200 and resp.headers["x-kvgate-cache"] == "miss", resp.text
                    assert len(resp.text) > size
                    on_loop = {name: thread == server.thread.name for name, thread in steps}
                    assert on_loop == {"look_up": True, "record": record_inline}, steps
                    again = client.post("/v1/chat/completions", json=body)
                    assert again.headers["x-kvgate-cache"] == "exact"  # stored either way
    finally:
        server.stop()
        pipeline.close()
        replica.stop()
