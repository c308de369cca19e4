"""Tenant isolation, the API-key gate on every route, secrets kept out of logs and metrics, and
the loopback default — against the real proxy (in-process server and a `kvgate serve` process)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from conftest import route_config

from kvgate.middleware.server.auth import BASIC_CHALLENGE, bind_warning, on_dashboard
from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv

TENANTS = [f"tenant-key-{i:02d}" for i in range(50)]
QUESTIONS = [
    ("What is the boiling point of water at sea level?", "At sea level, what temperature does water boil at?"),
    ("Who wrote the novel Pride and Prejudice?", "Who is the author of Pride and Prejudice?"),
]


@pytest.fixture
def keyed(make_proxy, backend, tmp_path):
    raw = route_config(backend.api_base, tmp_path / "iso")
    raw["auth"] = {"keys": TENANTS}
    return make_proxy(raw=raw)


def test_fifty_tenants_never_see_each_others_answers(keyed, backend):
    """Every tenant asks the same questions (and paraphrases): each gets its own miss first, then
    hits only on what it stored itself."""

    def tenant_run(key: str) -> list[tuple[str, str, str]]:
        out = []
        for question, paraphrase in QUESTIONS:
            for text in (question, paraphrase, question):
                resp = keyed.chat(text, key=key)
                assert resp.status_code == 200, resp.text
                out.append((text, resp.headers["x-kvgate-cache"], resp.json()["choices"][0]["message"]["content"]))
        return out

    with ThreadPoolExecutor(8) as pool:
        runs = dict(zip(TENANTS, pool.map(tenant_run, TENANTS)))
    answers_by_tenant: dict[str, set[str]] = {}
    for key, rows in runs.items():
        tiers = [tier for _, tier, _ in rows]
        assert tiers == ["miss", "semantic", "exact"] * len(QUESTIONS), (key, tiers)
        # the hits return this tenant's own miss answer
        for q in range(len(QUESTIONS)):
            assert rows[3 * q][2] == rows[3 * q + 1][2] == rows[3 * q + 2][2]
        answers_by_tenant[key] = {rows[3 * q][2] for q in range(len(QUESTIONS))}
    every = [a for answers in answers_by_tenant.values() for a in answers]
    assert len(every) == len(set(every)) == len(TENANTS) * len(QUESTIONS)  # no answer served to two tenants


def test_shared_scope_is_shared_across_fifty_tenants(keyed, backend):
    calls = backend.count
    question, paraphrase = QUESTIONS[0]
    first = keyed.chat(question, key=TENANTS[0], model="shared-1")
    assert first.headers["x-kvgate-cache"] == "miss"

    def ask(key: str) -> tuple[str, str]:
        resp = keyed.chat(paraphrase if TENANTS.index(key) % 2 else question, key=key, model="shared-1")
        return resp.headers["x-kvgate-cache"], resp.json()["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ask, TENANTS[1:]))
    assert {tier for tier, _ in got} <= {"exact", "semantic"}
    assert {text for _, text in got} == {first.json()["choices"][0]["message"]["content"]}
    assert backend.count == calls + 1


def _app_paths(proxy: Any) -> list[tuple[str, str]]:
    app = proxy.server.config.app
    out = []
    for route in app.routes:
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            if method != "HEAD":
                out.append((method, route.path.replace("{", "").replace("}", "")))
    return out


def test_every_route_but_the_probes_needs_a_key(keyed):
    """Enumerates the app's routes, so an endpoint added later is covered without editing this."""
    paths = _app_paths(keyed)
    assert ("POST", "/v1/chat/completions") in paths and ("GET", "/metrics") in paths
    assert ("GET", "/openapi.json") in paths
    for method, path in paths + [("GET", "/no/such/path"), ("POST", "/v1/admin/anything")]:
        for headers in (
            {},
            {"authorization": "Bearer not-a-tenant"},
            {"authorization": "Basic " + TENANTS[0]},
            {"authorization": f"Bearer {TENANTS[0]}x"},
        ):
            resp = keyed.http.request(method, path, headers=headers, json={})
            if path in ("/health", "/ready"):  # a load balancer's probes carry no key (and tell no tenant's data)
                assert resp.status_code == 200
                continue
            assert resp.status_code == 401, (method, path, headers, resp.status_code)
            err = resp.json()["error"]
            # the dashboard's GETs challenge with Basic, so a browser shows its login prompt (middleware/server/auth.py)
            challenge = BASIC_CHALLENGE if on_dashboard(path, method) else "Bearer"
            assert err["code"] == "invalid_api_key" and resp.headers["www-authenticate"] == challenge
        authed = keyed.http.request(method, path, headers={"authorization": f"Bearer {TENANTS[3]}"}, json={})
        assert authed.status_code != 401, (method, path)


def test_cache_control_and_feedback_need_a_key(keyed, backend):
    keyed.chat("A question worth caching?", key=TENANTS[0])
    calls = backend.count
    no_key = keyed.http.post(
        "/v1/chat/completions",
        headers={"x-kvgate-cache-control": "no-cache"},
        json={"model": "demo-1", "messages": [{"role": "user", "content": "A question worth caching?"}]},
    )
    assert no_key.status_code == 401 and backend.count == calls
    assert keyed.http.post("/v1/cache/feedback", json={"request_id": "x", "correct": False}).status_code == 401


def test_bind_warning():
    assert bind_warning("127.0.0.1", []) is None
    assert bind_warning("::1", []) is None and bind_warning("localhost", []) is None
    assert "no auth.keys" in (bind_warning("0.0.0.0", []) or "")
    assert "no auth.keys" in (bind_warning("my-host.example", []) or "")
    assert "reachable beyond" in (bind_warning("0.0.0.0", ["k"]) or "")


SECRET_KEY = "sk-kvgate-VERYSECRET-7f3a9c"
SECRET_PROMPT = "zanzibar-quokka-marmalade"


def test_serve_binds_loopback_and_keeps_keys_and_prompts_out_of_logs(tmp_path: Path):
    """A real `kvgate serve` (access log on) after misses, hits, streams, bad requests, backend
    failures and bad keys: neither the key nor the prompt shows in its output or /metrics."""
    backend_port, proxy_port = free_port(), free_port()
    config = route_config(f"http://127.0.0.1:{backend_port}/v1", tmp_path / "cache")
    config["auth"] = {"keys": [SECRET_KEY]}
    config["server"] = {"port": proxy_port}  # no host: the default must be loopback
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    fake = Proc("backend", kvgate_argv("demo-backend", "--port", str(backend_port)), tmp_path)
    proxy = Proc("proxy", kvgate_argv("serve", "--config", str(tmp_path / "config.yaml"), "--access-log"), tmp_path)
    url = f"http://127.0.0.1:{proxy_port}"
    try:
        fake.wait_http(f"http://127.0.0.1:{backend_port}/v1/models")
        proxy.wait_http(f"{url}/health")
        listening = {
            c.laddr.ip for c in psutil.Process(proxy.proc.pid).net_connections("inet") if c.status == psutil.CONN_LISTEN
        }
        assert listening == {"127.0.0.1"}, listening

        auth = {"authorization": f"Bearer {SECRET_KEY}"}
        with httpx.Client(base_url=url, timeout=30) as http:

            def chat(content: Any, headers: dict[str, str] = auth, **extra: Any) -> httpx.Response:
                body = {"model": "demo-1", "messages": [{"role": "user", "content": content}], **extra}
                return http.post("/v1/chat/completions", json=body, headers=headers)

            assert chat(f"Tell me about {SECRET_PROMPT}").status_code == 200
            assert chat(f"Tell me about {SECRET_PROMPT}").headers["x-kvgate-cache"] == "exact"
            assert chat(f"Please tell me about {SECRET_PROMPT}", stream=True).status_code == 200
            assert chat(f"{SECRET_PROMPT} [[fail]]").status_code == 502
            assert chat(f"{SECRET_PROMPT} [[fail]]", stream=True).status_code == 502
            assert chat(f"{SECRET_PROMPT}", temperature="hot").status_code == 400
            assert chat(f"{SECRET_PROMPT}", headers={"authorization": f"Bearer {SECRET_KEY}-wrong"}).status_code == 401
            assert chat(f"{SECRET_PROMPT}", headers={**auth, "x-kvgate-cache-control": "bogus"}).status_code == 400
            bad = http.post(
                "/v1/chat/completions",
                headers=auth,
                content=f'{{"model": "demo-1", "messages": [{{"role": "user", "content": "{SECRET_PROMPT}\\ud800"}}]}}',
            )
            assert bad.status_code == 400
            metrics = http.get("/metrics", headers=auth)
            assert metrics.status_code == 200 and "kvgate_requests_total" in metrics.text
            assert SECRET_KEY not in metrics.text and SECRET_PROMPT not in metrics.text
            assert "VERYSECRET" not in metrics.text
    finally:
        proxy.stop()
        fake.stop()
    log = proxy.log_path.read_text(errors="replace")
    assert "POST /v1/chat/completions" in log  # the access log was on
    assert "VERYSECRET" not in log and SECRET_PROMPT not in log, log[-3000:]
    assert json.dumps(SECRET_PROMPT)[1:-1] not in log
