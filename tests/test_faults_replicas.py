"""Replica faults through the proxy: dead, dying mid-stream, slow and hung replicas (issue 6, part 1).

In-thread fake replicas for the stream-splicing and timeout rules; real processes (4 sim replicas
+ `kvgate serve`, one SIGKILLed under load) for the end-to-end claim. Assertions are on counts
(errors, failovers, who served what), never on timings.
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from kvgate.engines.demo import Calls, create_fake_app
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import parse_config
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import ServerThread
from kvgate.tools.bench.replica_faults import check_sse, parse_metrics, run_scenario


class Fleet:
    """Fake replicas (each with its own fault) behind an in-thread proxy."""

    def __init__(
        self, tmp: Path, faults: list[dict[str, Any]], *, policy: str = "round_robin", timeout: float = 10.0
    ) -> None:
        self.calls = [Calls() for _ in faults]
        self.replicas = [ServerThread(create_fake_app(c, **f)).start() for c, f in zip(self.calls, faults)]
        config = parse_config(
            {
                "cache_dir": str(tmp / "cache"),
                "routes": [
                    {
                        "name": "local",
                        "model": "fake*",
                        "backend": {"model": "openai/fake", "api_key": "none", "timeout": timeout},
                        "exact": False,
                        "semantic": {"enabled": False},  # every request reaches a replica
                        "replicas": [{"name": f"r{i}", "api_base": f"{r.url}/v1"} for i, r in enumerate(self.replicas)],
                        "routing": {"policy": policy, "tokenizer": "text", "down_for_s": 30, "probe_interval_s": 60},
                    }
                ],
            }
        )
        self.pipeline = build_pipeline(config)
        self.proxy = ServerThread(create_app(config, self.pipeline)).start()
        self.http = httpx.Client(base_url=self.proxy.url, timeout=60)

    def chat(self, content: str, **params: Any) -> httpx.Response:
        body = {"model": "fake-1", "messages": [{"role": "user", "content": content}], **params}
        return self.http.post("/v1/chat/completions", json=body)

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self.http.get("/metrics").text)

    def stop(self) -> None:
        self.http.close()
        self.proxy.stop()
        self.pipeline.close()
        for r in self.replicas:
            r.stop()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Any]:
    made: list[Fleet] = []

    def make(faults: list[dict[str, Any]], **kw: Any) -> Fleet:
        made.append(Fleet(tmp_path / str(len(made)), faults, **kw))
        return made[-1]

    yield make
    for f in made:
        f.stop()


def _streamed(resp: httpx.Response) -> tuple[str, list[str]]:
    """(text, in-band error messages) of an SSE body."""
    text, errors = "", []
    for line in resp.text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if "error" in event:
            errors.append(event["error"]["message"])
        for choice in event.get("choices") or []:
            text += (choice.get("delta") or {}).get("content") or ""
    return text, errors


MID_STREAM = 'kvgate_backend_failovers_total{route="local",when="mid_stream"}'


def test_greedy_stream_resumes_on_another_replica(fleet) -> None:
    """r0 cuts every stream after 3 words; greedy streams that start there finish on r1 with
    exactly the answer a healthy replica gives: nothing repeated, nothing lost."""
    f = fleet([{"break_streams_after": 3}, {}])
    question = "[[fixed]] Tell me a long story about a fox who lived under a bridge"
    for _ in range(4):  # round robin: at least two start on r0
        resp = f.chat(question, stream=True, temperature=0)
        text, errors = _streamed(resp)
        assert resp.status_code == 200 and resp.text.rstrip().endswith("data: [DONE]")
        assert errors == [] and text == f"Answer: {question}"
    assert f.calls[0].count >= 1
    assert f.metrics()[MID_STREAM] >= 1


def test_non_greedy_stream_break_is_a_clean_in_band_error(fleet) -> None:
    """Without temperature 0 another replica may say something else: no splice, an honest error."""
    f = fleet([{"break_streams_after": 3}])
    resp = f.chat("[[fixed]] Tell me a long story about a fox", stream=True)
    text, errors = _streamed(resp)
    assert resp.status_code == 200 and resp.text.rstrip().endswith("data: [DONE]")
    assert len(errors) == 1 and "backend error" in errors[0]
    assert text == "Answer: [[fixed]] Tell "  # the 3 words r0 sent before it died, nothing invented


def test_diverging_retry_is_an_error_not_a_splice(fleet) -> None:
    """A retry whose text differs from what was sent (here: the call number changes) must not be
    glued onto it."""
    f = fleet([{"break_streams_after": 3}, {}])
    f.calls[1].count = 100  # r1 numbers its answers from 101: its text cannot match r0's "Answer 1: "
    outcomes = Counter()
    for i in range(4):
        text, errors = _streamed(f.chat(f"Tell me a long story number {i}", stream=True, temperature=0))
        if errors:
            assert "differs" in errors[0], errors
            outcomes["error"] += 1
        else:
            assert text.endswith(f"Tell me a long story number {i}")
            outcomes["ok"] += 1
    assert outcomes["error"] >= 1  # every stream that started on r0


def test_slow_replica_is_routed_around(fleet) -> None:
    """r1 takes 0.3 s per answer, the others none: load-aware routing sends it less than its share."""
    f = fleet([{}, {"delay_s": 0.3}, {}, {}], policy="cache_aware")
    with ThreadPoolExecutor(8) as pool:
        resps = list(pool.map(lambda i: f.chat(f"question {i}: what is {i} squared?"), range(120)))
    assert all(r.status_code == 200 for r in resps)
    served = Counter(r.headers["x-kvgate-replica"] for r in resps)
    assert served["r1"] < 120 / 4, served


def test_hung_replica_times_out_and_fails_over(fleet) -> None:
    """r1 never answers within backend.timeout (0.5 s): each request sent there times out and is
    retried on another replica; the client sees no error and r1 is taken out of rotation."""
    f = fleet([{}, {"delay_s": 10}, {}], policy="round_robin", timeout=0.5)
    resps = [f.chat(f"question {i}", stream=i % 2 == 1, temperature=0) for i in range(6)]
    for r in resps:
        assert r.status_code == 200, r.text
        assert r.headers["x-kvgate-replica"] != "r1"
        if r.headers["content-type"].startswith("text/event-stream"):
            assert _streamed(r)[1] == []
    assert f.calls[1].count == 1  # tried once, then its circuit stayed open (down_for_s 30)
    metrics = f.metrics()
    assert metrics['kvgate_backend_failovers_total{route="local",when="before_first_byte"}'] == 1
    assert metrics['kvgate_replica_up{replica="r1",route="local"}'] == 0.0


def test_sse_checker() -> None:
    ok = ['data: {"choices":[{"delta":{"content":"a b"}}]}', "", "data: [DONE]"]
    assert check_sse(ok, "a b") is None
    assert "in-band" in (check_sse(['data: {"error":{"message":"x"}}', "data: [DONE]"], "") or "")
    assert check_sse(ok[:1], "a b") == "stream did not end with [DONE]"


@pytest.mark.slow
def test_sigkill_one_of_four_replicas_under_load(tmp_path: Path) -> None:
    """4 sim replicas + `kvgate serve` as processes, 16 concurrent greedy requests (half streamed),
    r1 SIGKILLed a quarter of the way through and restarted at half: every answer arrives whole
    and correct, r1's circuit opens, and the health probe brings traffic back to it."""
    result = run_scenario("kill", work=tmp_path, requests=240, concurrency=16)
    assert result["errors"] == 0, result["error_samples"]
    assert result["circuit_opened"]
    assert result["failovers_before_first_byte"] + result["failovers_mid_stream"] >= 1
    assert result["victim_requests_after_restart"] >= 1, result["served_by"]


@pytest.mark.slow
def test_a_replica_down_from_the_start_costs_no_errors(tmp_path):
    """The down scenario of `kvgate bench replica-faults`: r1 is never started; every request is
    answered, none by r1, and the proxy's CPU per request is reported."""
    result = run_scenario("down", work=tmp_path, requests=120, concurrency=8)
    assert result["errors"] == 0, result["error_samples"]
    assert result["victim_share"] == 0.0
    assert result["proxy_cpu_ms_per_request"] > 0
