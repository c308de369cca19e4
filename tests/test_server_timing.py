"""The proxy's Server-Timing header (`server.timing_header`): the pure formatter, and through the
real proxy and pipeline in front of a fake replica (kvgate.engines.demo) that waits before it
answers, so the replica's own time must land in `engine` and nowhere else."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvgate.middleware.server.timing import server_timing
from kvgate.tools.bench.vllm_arena_cpu import timing_steps as steps  # the bench's reader of the header
from tests.conftest import ServedProxy

WAIT_S = 0.3  # the fake replica's wait before it answers ([[sleep=S]])


RELAYED = ["read", "hop", "cache", "prefix", "route", "engine", "relay"]


def test_the_steps_add_up_to_the_handlers_time() -> None:
    # pipeline start, look-up start / tiers / prefix, back on the loop, sent, first bytes
    stamps = (10.002, 10.0025, 10.0030, 10.0045, 10.0047, 10.005, 10.905)
    relayed = steps(server_timing(10.0, stamps, 10.906, hit=False))
    assert list(relayed) == RELAYED
    assert relayed == pytest.approx(
        {"read": 2.0, "hop": 0.7, "cache": 0.5, "prefix": 1.5, "route": 0.3, "engine": 900.0, "relay": 1.0}
    )
    assert sum(relayed.values()) == pytest.approx(906.0)
    inline = steps(server_timing(10.0, (10.002, 10.002, 10.003, 10.003, 10.003, 10.005, 10.905), 10.906, False))
    assert inline["hop"] == 0.0 and inline["prefix"] == 0.0 and inline["route"] == pytest.approx(2.0)
    assert steps(server_timing(1.0, (1.001,), 1.004, hit=True)) == pytest.approx({"read": 1.0, "cache": 3.0})
    assert list(steps(server_timing(1.0, (1.001,), 1.5, hit=False))) == ["read", "forward"]
    assert list(steps(server_timing(1.0, (), 1.5, hit=False))) == ["read"]
    # a clock read out of order never gives a negative duration
    assert steps(server_timing(2.0, (1.9,), 2.1, hit=True))["read"] == 0.0


@given(st.lists(st.floats(min_value=0.0, max_value=5.0), min_size=8, max_size=8))
def test_any_ordered_stamps_add_up(gaps: list[float]) -> None:
    """Whatever the gaps between the stamps (in ms), the relayed steps are non-negative and their
    sum is the handler's time, to the header's rounding."""
    clock = [10.0]
    for gap in gaps:
        clock.append(clock[-1] + gap / 1000)
    arrived, *stamps, now = clock
    relayed = steps(server_timing(arrived, tuple(stamps), now, hit=False))
    assert list(relayed) == RELAYED and min(relayed.values()) >= 0.0
    assert sum(relayed.values()) == pytest.approx((now - arrived) * 1000, abs=0.005 * len(relayed))


class Proxy(ServedProxy):
    def __init__(self, tmp: Path, timing: bool) -> None:
        def config(api_base: str) -> dict[str, Any]:
            route: dict[str, Any] = {
                "name": "r",
                "model": "fake*",
                "backend": {"model": "openai/fake", "api_key": "none", "timeout": 30},
                "semantic": {"enabled": False},
                "replicas": [{"name": "r0", "api_base": api_base}],
                "routing": {"policy": "cache_aware", "prefix": {"tokenizer": "text"}},
            }
            return {"cache_dir": str(tmp / "cache"), "routes": [route], "server": {"timing_header": timing}}

        super().__init__(config)


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[Proxy]:
    p = Proxy(tmp_path, timing=True)
    yield p
    p.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_a_relayed_miss_then_its_hit(proxy: Proxy, stream: bool) -> None:
    body = {
        "model": "fake",
        "messages": [{"role": "user", "content": f"where does the time go, stream={stream}? [[sleep={WAIT_S}]]"}],
        "stream": stream,
        "temperature": 0,
    }
    begun = time.perf_counter()
    miss = proxy.http.post("/v1/chat/completions", json=body)
    elapsed_ms = (time.perf_counter() - begun) * 1000
    assert miss.status_code == 200, miss.text
    assert miss.headers["x-kvgate-cache"] == "miss"
    timing = steps(miss.headers["server-timing"])
    assert list(timing) == RELAYED
    assert timing["engine"] >= WAIT_S * 1000  # the replica's wait is the engine's step
    assert sum(timing.values()) - timing["engine"] < WAIT_S * 1000  # and no other step's
    assert sum(timing.values()) <= elapsed_ms  # the header only sees time the client waited
    if stream:
        assert miss.text.rstrip().endswith("data: [DONE]")

    hit = proxy.http.post("/v1/chat/completions", json=body)
    assert hit.headers["x-kvgate-cache"] == "exact"
    timing = steps(hit.headers["server-timing"])
    assert list(timing) == ["read", "cache"]
    assert sum(timing.values()) < WAIT_S * 1000


def test_completions_carry_it_and_a_batch_does_not(proxy: Proxy) -> None:
    one = proxy.http.post("/v1/completions", json={"model": "fake", "prompt": "a prompt"})
    assert one.status_code == 200, one.text
    assert list(steps(one.headers["server-timing"])) == RELAYED
    batch = proxy.http.post("/v1/completions", json={"model": "fake", "prompt": ["one prompt", "another"]})
    assert batch.status_code == 200, batch.text
    assert len(batch.json()["choices"]) == 2
    assert "server-timing" not in batch.headers


def test_off_by_default(tmp_path: Path) -> None:
    p = Proxy(tmp_path, timing=False)
    try:
        resp = p.http.post(
            "/v1/chat/completions", json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert resp.status_code == 200, resp.text
        assert "server-timing" not in resp.headers
        assert json.loads(resp.text)["choices"]
    finally:
        p.stop()


def test_the_header_says_where_the_look_up_ran(proxy: Proxy) -> None:
    """A short prompt's look-up runs on the loop (its prefix is matched in `route`); a
    prompt past the inline bound (kvgate.middleware.cache.offload) runs it on a worker thread,
    which hashes and matches the prompt there (`prefix`), and the hand-offs show as `hop`."""
    from kvgate.middleware.cache.offload import INLINE_TOTAL_CHARS

    def timing(content: str) -> dict[str, float]:
        body = {"model": "fake", "messages": [{"role": "user", "content": content}], "temperature": 0}
        resp = proxy.http.post("/v1/chat/completions", json=body)
        assert resp.status_code == 200, resp.text
        return steps(resp.headers["server-timing"])

    short = timing("a short question?")
    assert short["prefix"] == 0.0
    long = timing("words of a long document " * (INLINE_TOTAL_CHARS // 20))
    assert long["hop"] > 0.0 and long["prefix"] > 0.0
