"""semantic.max_error_rate end to end: uvicorn proxy → real LiteLLM → a deterministic local
backend that answers paraphrases alike (tools/bench/trust_replay.py's), the real embedder, FAISS, the
disk observation store; config errors; the `kvgate bench trust` command on a tiny pairs file."""

from __future__ import annotations

import json
import re
import time

import pytest

from kvgate.index.responses.entries.base import CacheEntry
from kvgate.index.responses.observations.disk import DiskObservationStore
from kvgate.index.responses.trust import Observation, fit_rule
from kvgate.middleware.cache.trust_gate import Exploration, TrustGate
from kvgate.middleware.cli import main as cli_main
from kvgate.middleware.config import parse_config
from kvgate.middleware.errors import ConfigError
from kvgate.tools.bench.procs import ServerThread
from kvgate.tools.bench.trust_replay import backend_app
from tests.conftest import Proxy

PARIS = "Paris is the capital of France."
QUESTIONS = {
    "What is the capital of France?": PARIS,
    "Tell me the capital city of France": PARIS,
    "Which city is the capital of France?": PARIS,
    "What is the capital of Spain?": "Madrid.",
}


@pytest.fixture(scope="module")
def same_answers():
    server = ServerThread(backend_app(QUESTIONS)).start()
    yield server
    server.stop()


def trust_config(api_base: str, cache_dir, **semantic) -> dict:
    return {
        "cache_dir": str(cache_dir),
        "stats": {"interval_s": 0.2, "keep": 50},
        "routes": [
            {
                "name": "chat",
                "model": "demo-*",
                "semantic": {"max_error_rate": 0.05, **semantic},
                "backend": {"model": "openai/served-name", "api_base": api_base, "api_key": "sk-x"},
            }
        ],
    }


def judged_lookups(trust: TrustGate, route: str = "chat", n: int = 100) -> None:
    """`n` lookups that found no candidate, as a process sees them before the ones a test makes: a
    process serves only once its lookups are enough to show a wrong-hit rate of δ = 0.05 with its
    95% Wilson bound (kvgate.index.responses.trust.allowance: n·δ/(1 − δ) > 1.96²)."""
    for _ in range(n):
        trust.judge(route, 0.05, None, 0.0, None)


def test_unsure_candidate_is_explored_and_its_verdict_kept(embedder, same_answers, tmp_path):
    cache_dir = tmp_path / "cache"
    proxy = Proxy(parse_config(trust_config(f"{same_answers.url}/v1", cache_dir)), embedder)
    try:
        first = proxy.chat("What is the capital of France?", temperature=0)
        assert first.headers["x-kvgate-cache"] == "miss"
        calls = same_answers.config.app.state.calls
        # no verified outcome yet: the candidate is explored, the client gets the fresh answer
        second = proxy.chat("Tell me the capital city of France", temperature=0)
        assert second.headers["x-kvgate-cache"] == "miss"
        assert second.json()["choices"][0]["message"]["content"] == PARIS
        assert same_answers.config.app.state.calls == calls + 1
        proxy.pipeline.trust.drain()
        entry_id = proxy.pipeline.requests.get(first.headers["x-kvgate-request-id"]).entry_id
        (seen,) = proxy.pipeline.trust.store.of_entry(entry_id)
        assert seen.correct and 0.6 < seen.similarity < 1.0
        metrics = proxy.http.get("/metrics").text
        assert 'kvgate_semantic_explorations_total{route="chat"} 1.0' in metrics
        assert 'kvgate_semantic_exploration_verdicts_total{route="chat",verdict="agree"} 1.0' in metrics
        # the dashboard's data carries the exploration for the route (middleware/telemetry/stats.py)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            totals = proxy.http.get("/v1/stats").json()["totals"].get("chat", {})
            if totals.get("explorations") == 1:
                break
            time.sleep(0.2)
        assert totals["explorations"] == 1 and totals["wrong_estimate"] == 0
    finally:
        proxy.stop()
    # observations survive a restart, and a second handle on the same cache sees them
    store = DiskObservationStore(cache_dir / "observations")
    assert store.of_entry(entry_id) == [seen] and store.count("chat") == 1
    store.close()


def test_confident_candidate_is_served_and_feedback_is_an_observation(embedder, same_answers, tmp_path):
    cache_dir = tmp_path / "cache"
    # verified history of this route (as earlier processes on this cache would have left it):
    # candidates above cosine 0.8 were right every time
    store = DiskObservationStore(cache_dir / "observations")
    for i in range(400):
        s = 0.6 + 0.4 * i / 400
        store.add("chat", 10_000 + i, Observation(s, s > 0.8))
    store.close()
    proxy = Proxy(parse_config(trust_config(f"{same_answers.url}/v1", cache_dir)), embedder)
    try:
        assert proxy.chat("What is the capital of France?", temperature=0).headers["x-kvgate-cache"] == "miss"
        judged_lookups(proxy.pipeline.trust)
        hit = proxy.chat("Which city is the capital of France?", temperature=0)
        assert hit.headers["x-kvgate-cache"] == "semantic", hit.headers
        similarity = float(hit.headers["x-kvgate-similarity"])
        assert hit.json()["choices"][0]["message"]["content"] == PARIS
        metrics = proxy.http.get("/metrics").text
        estimate = re.search(r'kvgate_semantic_served_wrong_estimate_total\{route="chat"\} (\S+)', metrics)
        assert 0.0 < float(estimate.group(1)) <= 0.05  # the served hit's bound, within δ
        # the caller says it was wrong: an observation of that entry, and the entry is gone
        request_id = hit.headers["x-kvgate-request-id"]
        entry_id = proxy.pipeline.requests.get(request_id).entry_id
        resp = proxy.http.post(
            "/v1/cache/feedback",
            json={"request_id": request_id, "correct": False},
            headers={"authorization": "Bearer key-a"},
        )
        assert resp.status_code == 200, resp.text
        assert proxy.pipeline.trust.store.of_entry(entry_id) == [
            Observation(pytest.approx(similarity, abs=1e-4), False)
        ]
        assert proxy.chat("Which city is the capital of France?", temperature=0).headers["x-kvgate-cache"] == "miss"
    finally:
        proxy.stop()


def test_non_deterministic_verdict_uses_answer_similarity(embedder, tmp_path):
    gate = TrustGate(DiskObservationStore(tmp_path / "obs"), embedder.embed)
    cached = CacheEntry(
        1, "s", {"choices": [{"message": {"role": "assistant", "content": "The capital of France is Paris."}}]}
    )
    gate.compare_later(Exploration("r", cached, 0.9, None), "Paris is the capital of France.", deterministic=False)
    gate.compare_later(Exploration("r", cached, 0.9, None), "Paris is the capital of France.", deterministic=True)
    gate.compare_later(Exploration("r", cached, 0.9, None), "Bananas are rich in potassium.", deterministic=False)
    gate.drain()
    assert [o.correct for o in gate.store.of_entry(1)] == [True, False, False]
    gate.close()


@pytest.mark.parametrize(
    "semantic, field",
    [
        ({"max_error_rate": 0.02, "threshold": 0.9}, "threshold"),
        ({"max_error_rate": 0.02, "target_precision": 0.9}, "target_precision"),
        ({"max_error_rate": 0.02, "verifier": True}, "verifier"),
        ({"max_error_rate": 1.5}, "max_error_rate"),
    ],
)
def test_config_errors_name_the_field(semantic, field):
    config = {"routes": [{"name": "chat", "model": "*", "semantic": semantic}]}
    with pytest.raises(ConfigError) as err:
        parse_config(config)
    assert "semantic" in err.value.message and field in err.value.message


def test_bench_trust_json_fields(tmp_path, capsys):
    rows = [
        "question1,question2,is_duplicate",
        "What is the capital of France?,Which city is the capital of France?,1",
        "How do I learn Python quickly?,What is the fastest way to learn Python?,1",
        "How do I learn Python quickly?,How do I learn Java quickly?,0",
        "What is the capital of Spain?,What is the capital of France?,0",
    ]
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("\n".join(rows) + "\n")
    out = tmp_path / "trust.json"
    code = cli_main(
        [
            "bench",
            "trust",
            "--pairs",
            str(pairs),
            "--slice",
            "all",
            "--thresholds",
            "0.8,0.95",
            "--max-error-rate",
            "0.05",
            "--json",
            str(out),
            "--plot",
            str(tmp_path / "p.png"),
        ]
    )
    assert code == 0
    result = json.loads(out.read_text())
    assert result["queries"] == 6 and result["classes"] == 4
    assert [set(r) >= {"threshold", "hit_rate", "error_rate"} for r in result["static"]] == [True, True]
    (verified,) = result["verified"]
    assert set(verified) >= {"max_error_rate", "hit_rate", "error_rate", "error_rate_ci_high", "backend_calls"}
    assert verified["backend_calls"] >= 6 - round(verified["hit_rate"] * 6)
    (best,) = result["best_static_within"]
    assert set(best) == {"max_error_rate", "threshold", "hit_rate", "error_rate", "error_rate_ci_high"}
    (strict,) = result["best_static_upper_within"]  # the verified runs' own test: the 95% upper bound ≤ δ
    assert strict["hit_rate"] <= best["hit_rate"] and (strict["error_rate_ci_high"] or 0.0) <= 0.05
    assert (tmp_path / "p.png").stat().st_size > 0
    # 2 of the 6 questions have a class asked before: no judge can hit more than 2/6 + δ
    assert result["ceiling"] == {
        "repeat_rate": round(2 / 6, 5),
        "max_hit_rate_within": [{"max_error_rate": 0.05, "hit_rate": round(2 / 6 + 0.05, 5)}],
    }
    # the same stream with the cache and the observations on a real Redis the run starts: the same counts
    on_redis = tmp_path / "trust_redis.json"
    assert (
        cli_main(
            [
                "bench",
                "trust",
                "--pairs",
                str(pairs),
                "--slice",
                "all",
                "--thresholds",
                "0.8,0.95",
                "--max-error-rate",
                "0.05",
                "--store",
                "redis",
                "--json",
                str(on_redis),
            ]
        )
        == 0
    )
    counted = ("hits", "wrong_hits", "backend_calls")
    redis_result = json.loads(on_redis.read_text())
    assert redis_result["store"] == "redis"
    for a, b in zip(result["static"] + result["verified"], redis_result["static"] + redis_result["verified"]):
        assert {k: a[k] for k in counted} == {k: b[k] for k in counted}
    assert cli_main(["bench", "trust", "--pairs", str(pairs), "--max-error-rate", "2"]) == 2
    assert "--max-error-rate" in capsys.readouterr().err


def test_the_gate_serves_within_its_budget_and_never_a_likely_wrong_candidate(embedder, tmp_path):
    """The gate on a real observation store with a verified record (right only above 0.9): a
    candidate more likely wrong than right is explored even where the budget would afford it;
    close candidates are served until the budget runs out, their estimates within the allowance."""
    import numpy as np

    from kvgate.index.responses.trust import allowance, budget_cutoff, charges, features

    store = DiskObservationStore(tmp_path / "obs")
    for i in range(400):
        s = 0.6 + 0.4 * i / 400
        store.add("chat", 10_000 + i, Observation(s, s > 0.9))
    gate = TrustGate(store, embedder.embed)
    entry = CacheEntry(1, "s", {"choices": [{"message": {"role": "assistant", "content": PARIS}}]})
    try:
        judged_lookups(gate, n=1000)
        far = [gate.judge("chat", 0.05, entry, 0.89, None) for _ in range(30)]
        assert not any(j.serve for j in far) and all(j.explore is not None and 0.5 < j.p_wrong < 0.9 for j in far)
        rule = fit_rule(store.pool("chat"))
        p, grads = charges(rule, np.stack([features(0.89)] * 30))
        assert (
            budget_cutoff(p, grads, np.array(rule.cov), allowance(1030, 0.05)) > 0.5
        )  # the budget alone would serve them
        served = [gate.judge("chat", 0.05, entry, 0.93, None) for _ in range(300)]
        assert served[0].serve and served[0].p_wrong < 0.2
        assert 0 < sum(j.serve for j in served) < 300  # the budget runs out: the rest are explored
        assert sum(j.p_wrong for j in served if j.serve) <= allowance(1330, 0.05)
    finally:
        gate.close()
