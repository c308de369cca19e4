"""A route with no response cache (`exact: false`, semantic off: kvgate as a router in front of
engines) through the proxy, beside a route with one: its misses are answered and routed as any
other's, and the router still learns prompt + answer for the next turn, but nothing is written
for them: no request-log record (so no feedback on them) and no write batch.

Fake replicas in threads (kvgate.engines.demo), the real proxy and pipeline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from tests.conftest import ServedProxy

# long enough for several routing blocks of the text tokenizer
QUESTION = "Explain, step by step and with an example for each step, how a radix tree stores prefixes " * 3


class Proxy(ServedProxy):
    def __init__(self, tmp: Path) -> None:
        def config(api_base: str) -> dict[str, Any]:
            route: dict[str, Any] = {
                "backend": {"model": "openai/fake", "api_key": "none", "timeout": 30},
                "semantic": {"enabled": False},
                "replicas": [{"name": "r0", "api_base": api_base}],
                "routing": {"policy": "cache_aware", "prefix": {"tokenizer": "text"}},
            }
            return {
                "cache_dir": str(tmp / "cache"),
                "routes": [
                    {**route, "name": "router", "model": "fake-r*", "exact": False},
                    {**route, "name": "cached", "model": "fake-c*"},
                ],
            }

        super().__init__(config)

    def chat(self, model: str, messages: list[dict[str, str]], stream: bool = False) -> httpx.Response:
        body = {"model": model, "messages": messages, "stream": stream, "temperature": 0}
        return self.http.post("/v1/chat/completions", json=body)


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[Proxy]:
    p = Proxy(tmp_path)
    yield p
    p.stop()


def answer_of(resp: httpx.Response, stream: bool) -> str:
    if not stream:
        return resp.json()["choices"][0]["message"]["content"]
    text = ""
    for line in resp.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[6:]).get("choices") or []:
                text += (choice.get("delta") or {}).get("content") or ""
    return text


@pytest.mark.parametrize("stream", [False, True])
def test_a_cacheless_route_routes_and_learns_but_writes_nothing(proxy: Proxy, stream: bool) -> None:
    first = [{"role": "user", "content": QUESTION}]
    resp = proxy.chat("fake-r1", first, stream)
    assert resp.status_code == 200 and resp.headers["x-kvgate-cache"] == "miss"
    assert resp.headers["x-kvgate-route"] == "router" and resp.headers["x-kvgate-replica"] == "r0"
    answer = answer_of(resp, stream)
    assert answer.startswith("Answer") and QUESTION.strip() in answer
    request_id = resp.headers["x-kvgate-request-id"]

    # nothing logged, no batch opened: feedback on it finds no such request
    assert proxy.pipeline.requests.get(request_id) is None
    assert proxy.pipeline.cache.commits.batches == 0
    judged = proxy.http.post("/v1/cache/feedback", json={"request_id": request_id, "correct": False})
    assert judged.status_code == 404 and judged.json()["error"]["param"] == "request_id"

    # the router still recorded prompt + answer (noted at its finish, hashed as the next turn
    # came): the next turn expects the question and most of the answer cached
    turn = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "And a trie?"}]
    again = proxy.chat("fake-r1", turn, stream)
    assert again.status_code == 200 and again.headers["x-kvgate-cache"] == "miss"
    assert int(again.headers["x-kvgate-expected-cached-tokens"]) > len(QUESTION) + len(answer) // 2

    # no answer was stored: the same first turn is a miss again, sent to the replica
    before = proxy.calls.count
    assert proxy.chat("fake-r1", first, stream).headers["x-kvgate-cache"] == "miss"
    assert proxy.calls.count == before + 1


def test_a_caching_route_beside_it_still_logs_and_batches(proxy: Proxy) -> None:
    first = [{"role": "user", "content": QUESTION}]
    resp = proxy.chat("fake-c1", first)
    assert resp.status_code == 200 and resp.headers["x-kvgate-route"] == "cached"
    record = proxy.pipeline.requests.get(resp.headers["x-kvgate-request-id"])
    assert record is not None and record.route == "cached" and record.entry_id is not None
    assert proxy.pipeline.cache.commits.batches >= 1
    assert proxy.chat("fake-c1", first).headers["x-kvgate-cache"] == "exact"
