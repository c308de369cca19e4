"""Request ids and `POST /v1/cache/feedback` end to end: uvicorn proxy → real LiteLLM → fake backend,
real embedder; and the SDK's Gateway.feedback. The verdicts are the caller's: any hit can be judged wrong."""

from __future__ import annotations

import asyncio
import json

import pytest

from kvgate import Gateway, cache_info
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import parse_config
from kvgate.middleware.errors import RequestNotFound
from tests.conftest import route_config

ORIGINAL = "How do I lose weight in a week?"
WRONG_MATCH = "How can I lose weight in one week?"  # similarity ≈ 0.94 to ORIGINAL
NEAR_COPY = "How do I lose weight in a week"  # ≈ 0.99 to ORIGINAL
FRESH = {"x-kvgate-cache-control": "no-store"}


def feedback(proxy, request_id: str, correct: bool, key: str = "key-a"):
    return proxy.http.post(
        "/v1/cache/feedback",
        json={"request_id": request_id, "correct": correct},
        headers={"authorization": f"Bearer {key}"},
    )


def test_every_response_has_a_request_id(make_proxy):
    proxy = make_proxy()
    ids = set()
    for stream in (False, True, False, True):  # miss, streamed exact hit, exact hit, streamed exact hit
        resp = proxy.chat("What is the capital of France?", stream=stream)
        assert resp.status_code == 200
        ids.add(resp.headers["x-kvgate-request-id"])
    resp = proxy.chat("Tell me the capital city of France", stream=True)
    assert resp.headers["x-kvgate-cache"] == "semantic"
    ids.add(resp.headers["x-kvgate-request-id"])
    assert len(ids) == 5 and all(i.startswith("kvg-") for i in ids)


def test_wrong_semantic_hit_removes_entry_and_tightens(make_proxy, tmp_path):
    cache_dir = tmp_path / "shared-cache"
    proxy = make_proxy(cache_dir)
    assert proxy.chat(ORIGINAL).headers["x-kvgate-cache"] == "miss"
    wrong = proxy.chat(WRONG_MATCH)
    assert wrong.headers["x-kvgate-cache"] == "semantic"
    similarity = float(wrong.headers["x-kvgate-similarity"])

    resp = feedback(proxy, wrong.headers["x-kvgate-request-id"], False)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "cache.feedback" and body["removed"] is True and body["tier"] == "semantic"

    # the original is asked again: the wrong entry is gone (miss), and the fresh answer is stored
    # with a floor just above the wrong match's similarity
    again = proxy.chat(ORIGINAL)
    assert again.headers["x-kvgate-cache"] == "miss"
    entry = proxy.pipeline.index.get(proxy.pipeline.requests.get(again.headers["x-kvgate-request-id"]).entry_id)
    assert entry.min_similarity == pytest.approx(similarity + 0.01, abs=1e-3)
    # the same wrong pairing no longer hits; the exact repeat and a near copy of the original still do
    assert proxy.chat(WRONG_MATCH, headers=FRESH).headers["x-kvgate-cache"] == "miss"
    assert proxy.chat(ORIGINAL).headers["x-kvgate-cache"] == "exact"
    assert proxy.chat(NEAR_COPY, headers=FRESH).headers["x-kvgate-cache"] == "semantic"

    metrics = proxy.http.get("/metrics", headers={"authorization": "Bearer key-a"}).text
    assert 'kvgate_cache_feedback_total{route="chat",tier="semantic",verdict="wrong"} 1.0' in metrics
    assert 'kvgate_feedback_entries_removed_total{route="chat"} 1.0' in metrics

    # survives a restart: the floor and the request log are on disk
    proxy.stop()
    restarted = make_proxy(cache_dir)
    assert restarted.chat(WRONG_MATCH, headers=FRESH).headers["x-kvgate-cache"] == "miss"
    assert restarted.chat(ORIGINAL).headers["x-kvgate-cache"] == "exact"
    assert feedback(restarted, wrong.headers["x-kvgate-request-id"], True).status_code == 200


def test_feedback_through_another_process_on_the_same_cache_dir(make_proxy, tmp_path):
    cache_dir = tmp_path / "shared-cache"
    first, second = make_proxy(cache_dir), make_proxy(cache_dir)  # two pipelines, two index handles
    assert first.chat(ORIGINAL).headers["x-kvgate-cache"] == "miss"
    served = first.chat(ORIGINAL)
    assert served.headers["x-kvgate-cache"] == "exact"
    resp = feedback(second, served.headers["x-kvgate-request-id"], False)
    assert resp.status_code == 200 and resp.json()["removed"] is True and resp.json()["tier"] == "exact"
    assert first.chat(ORIGINAL).headers["x-kvgate-cache"] == "miss"  # gone for the first process too


def test_wrong_miss_and_wrong_exact_hit_remove_the_entry(make_proxy):
    proxy = make_proxy()
    question = "How many legs does a spider have?"
    miss = proxy.chat(question, stream=True)
    assert miss.headers["x-kvgate-cache"] == "miss"
    resp = feedback(proxy, miss.headers["x-kvgate-request-id"], False)
    assert resp.json() | {"request_id": None} == {
        "object": "cache.feedback",
        "request_id": None,
        "correct": False,
        "tier": "miss",
        "route": "chat",
        "removed": True,
        "tightened": 0,
    }
    assert proxy.chat(question).headers["x-kvgate-cache"] == "miss"  # answered afresh and stored
    hit = proxy.chat(question)
    assert hit.headers["x-kvgate-cache"] == "exact"
    assert feedback(proxy, hit.headers["x-kvgate-request-id"], False).json()["removed"] is True
    assert proxy.chat(question).headers["x-kvgate-cache"] == "miss"


def test_correct_feedback_changes_nothing(make_proxy):
    proxy = make_proxy()
    proxy.chat(ORIGINAL)
    hit = proxy.chat(WRONG_MATCH)
    resp = feedback(proxy, hit.headers["x-kvgate-request-id"], True)
    assert resp.status_code == 200 and resp.json()["removed"] is False
    assert proxy.chat(WRONG_MATCH, headers=FRESH).headers["x-kvgate-cache"] == "semantic"
    metrics = proxy.http.get("/metrics").text
    assert 'kvgate_cache_feedback_total{route="chat",tier="semantic",verdict="correct"} 1.0' in metrics


def test_other_tenants_and_unknown_ids_get_404(make_proxy):
    proxy = make_proxy()
    proxy.chat(ORIGINAL)
    hit = proxy.chat(ORIGINAL)
    rid = hit.headers["x-kvgate-request-id"]
    other = feedback(proxy, rid, False, key="key-b")
    assert other.status_code == 404
    assert other.json()["error"]["code"] == "request_not_found" and other.json()["error"]["param"] == "request_id"
    assert proxy.chat(ORIGINAL).headers["x-kvgate-cache"] == "exact"  # untouched
    unknown = feedback(proxy, "kvg-0123456789abcdef0123456789abcdef", False)
    assert unknown.status_code == 404 and unknown.json()["error"]["message"] == other.json()["error"][
        "message"
    ].replace(rid, "kvg-0123456789abcdef0123456789abcdef")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"request_id": "kvg-x"}, "correct"),
        ({"correct": False}, "request_id"),
        ({"request_id": 5, "correct": False}, "request_id"),
        ({"request_id": "kvg-x", "correct": "no"}, "correct"),
        ({"request_id": "kvg-x", "correct": False, "extra": 1}, "extra"),
    ],
)
def test_bad_feedback_bodies_are_400(make_proxy, body, param):
    proxy = make_proxy()
    resp = proxy.http.post("/v1/cache/feedback", json=body)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err


def test_malformed_feedback_json_is_400(make_proxy):
    proxy = make_proxy()
    resp = proxy.http.post("/v1/cache/feedback", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]["message"]


def test_feedback_needs_a_key_when_keys_are_set(make_proxy, backend, tmp_path):
    raw = route_config(backend.api_base, tmp_path / "cache") | {"auth": {"keys": ["key-a", "key-b"]}}
    proxy = make_proxy(raw=raw)
    rid = proxy.chat(ORIGINAL).headers["x-kvgate-request-id"]
    anonymous = proxy.http.post("/v1/cache/feedback", content=b"not even json")
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "invalid_api_key"
    wrong_key = feedback(proxy, rid, False, key="key-z")
    assert wrong_key.status_code == 401
    assert feedback(proxy, rid, False, key="key-b").status_code == 404
    assert feedback(proxy, rid, False, key="key-a").json()["removed"] is True


@pytest.fixture
def gateway(embedder, backend, tmp_path):
    config = parse_config(route_config(backend.api_base, tmp_path / "cache"))
    gw = Gateway(config, tenant="team-a", pipeline=build_pipeline(config, embedder=embedder))
    yield gw
    gw.close()


def ask(content: str) -> dict:
    return {"model": "demo-1", "messages": [{"role": "user", "content": content}]}


def test_sdk_feedback(gateway):
    assert cache_info(gateway.completion(**ask(ORIGINAL))).cache == "miss"
    hit = cache_info(gateway.completion(**ask(WRONG_MATCH)))
    assert hit.cache == "semantic" and hit.request_id.startswith("kvg-")
    with pytest.raises(RequestNotFound):
        gateway.feedback(hit.request_id, False, namespace="team-b")
    outcome = gateway.feedback(hit.request_id, False)
    assert outcome.removed and outcome.tier == "semantic"
    assert cache_info(gateway.completion(**ask(ORIGINAL))).cache == "miss"
    assert cache_info(gateway.completion(**ask(WRONG_MATCH), cache={"no-store": True})).cache == "miss"

    stream = gateway.completion(**ask(ORIGINAL), stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert stream.kvgate.cache == "exact" and text

    async def async_side() -> None:
        response = await gateway.acompletion(**ask(ORIGINAL))
        outcome = await gateway.afeedback(cache_info(response).request_id, False)
        assert outcome.removed and outcome.tier == "exact"

    asyncio.run(async_side())
    assert cache_info(gateway.completion(**ask(ORIGINAL))).cache == "miss"
    assert json.dumps(outcome.to_json())  # JSON-ready, as the proxy returns it


def _run_example(name: str, arg: str) -> list[str]:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, str(root / "examples" / name), arg],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_sdk_feedback_example(backend):
    lines = _run_example("sdk_feedback.py", backend.api_base)
    assert [line.split()[0] for line in lines] == ["miss", "semantic", "feedback:", "miss", "miss"]
    assert lines[2].startswith("feedback: removed=True")


def test_proxy_feedback_example(make_proxy):
    proxy = make_proxy()
    lines = _run_example("proxy_feedback.py", proxy.url)
    assert [line.split()[0] for line in lines] == ["miss", "semantic", "feedback:", "miss"]
    assert "'removed': True" in lines[2]


def test_feedback_off_keeps_no_request_ids(make_proxy, backend, tmp_path):
    """`feedback.enabled: false`: answers are cached and served as before and still carry request
    ids, but no request-id log is made (no directory, no records), feedback answers 404 naming the
    setting (the proxy's OpenAI error, the pipeline's RequestNotFound), and an erasure finds no
    records to remove."""
    from tests.conftest import route_config

    raw = route_config(backend.api_base, tmp_path / "cache")
    raw["feedback"] = {"enabled": False}
    proxy = make_proxy(raw=raw)
    ids = []
    for stream in (False, True, False):  # a miss, then exact hits (inline: the loop's group commit)
        resp = proxy.chat("What is the capital of France?", stream=stream)
        assert resp.status_code == 200
        ids.append(resp.headers["x-kvgate-request-id"])
    assert [proxy.chat("What is the capital of France?").headers["x-kvgate-cache"]] == ["exact"]
    assert all(i.startswith("kvg-") for i in ids) and len(set(ids)) == 3
    assert not (tmp_path / "cache" / "requests").exists()
    assert proxy.pipeline.requests.get(ids[0]) is None
    resp = feedback(proxy, ids[0], False)
    assert resp.status_code == 404
    error = resp.json()["error"]
    assert "feedback.enabled" in error["message"] and error["param"] == "request_id"
    assert proxy.chat("What is the capital of France?").headers["x-kvgate-cache"] == "exact"  # nothing removed
    with pytest.raises(RequestNotFound, match="feedback.enabled"):
        proxy.pipeline.feedback(ids[1], False, tenant="key-a")
    tenant = proxy.pipeline.requests  # the log the pipeline holds: one that keeps nothing
    assert tenant.stats() == {"storage_errors": 0} and tenant.erase_tenant("anyone") == 0
    erased = proxy.pipeline.governance.erase_tenant("anyone")
    assert erased.request_log == 0 and erased.scrubbed


def test_an_inline_hit_with_no_record_still_yields_to_the_loop(make_proxy, backend, tmp_path):
    """With feedback off an inline hit has no log step to wait for; `logged` still gives the loop
    one turn (what a hit with a log step waits at least), so a run of hits does not hold it."""
    from tests.conftest import route_config

    raw = route_config(backend.api_base, tmp_path / "cache")
    raw["feedback"] = {"enabled": False}
    proxy = make_proxy(raw=raw)
    cache = proxy.pipeline.cache
    route = proxy.pipeline.config.routes[0]
    body = {"model": "demo-1", "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    assert proxy.pipeline.complete(body, "key-a").info.cache == "miss"

    async def main() -> list[str]:
        order: list[str] = []
        looked = cache.look_up(cache.view(route, body, tenant="key-a"), 0.0, inline=True)
        assert looked.result is not None and looked.result.info.cache == "exact"
        asyncio.get_running_loop().call_soon(order.append, "other socket")
        await cache.logged(looked)
        order.append("hit answered")
        return order

    assert asyncio.run(main()) == ["other socket", "hit answered"]
