"""The /ui dashboard in a real headless Chromium (Debian's, driven by Playwright) against a real
proxy and a fake backend: the page shows the traffic's numbers, and a wrong key shows a sign-in
prompt, never data. Screenshot: test-artifacts/dashboard.png."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest
from playwright.sync_api import Browser, sync_playwright

from kvgate.middleware.config import parse_config
from tests.conftest import ROOT, Proxy, route_config

KEY = "key-dashboard"
ARTIFACTS = ROOT / "test-artifacts"
QUESTIONS = ["What is the capital of France?", "How tall is Mount Everest?", "Who wrote Hamlet?"]


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "Debian's chromium is needed for the dashboard test: `make install` installs it"
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=chromium_path(), headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def proxy(embedder: Any, backend: Any, tmp_path: Path) -> Iterator[Proxy]:
    raw = {**route_config(backend.api_base, tmp_path / "cache"), "auth": {"keys": [KEY]}, "stats": {"interval_s": 0.25}}
    raw["routes"].append(
        {
            "name": "local",
            "model": "smol*",
            "semantic": {"enabled": False},  # two replicas
            "backend": {"model": "openai/served", "api_key": "sk-x"},
            "replicas": [{"name": n, "api_base": backend.api_base} for n in ("r1", "r2")],
            "routing": {"policy": "round_robin"},
        }
    )
    started = Proxy(parse_config(raw), embedder)
    yield started
    started.stop()


def test_dashboard_shows_the_traffic(browser: Browser, proxy: Proxy) -> None:
    for question in QUESTIONS:  # each one a miss, then an exact hit
        assert proxy.chat(question, key=KEY).headers["x-kvgate-cache"] == "miss"
        assert proxy.chat(question, key=KEY).headers["x-kvgate-cache"] == "exact"
    for turn in ("one", "two"):  # misses on the replica route: one per replica
        assert proxy.chat(f"Routed question {turn}", key=KEY, model="smollm2").headers["x-kvgate-replica"]
    context = browser.new_context(
        http_credentials={"username": "ops", "password": KEY}, viewport={"width": 1280, "height": 1400}
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    assert page.goto(proxy.url + "/ui").status == 200
    page.wait_for_function(f"document.getElementById('misses').textContent === '{len(QUESTIONS) + 2}'", timeout=10_000)
    page.wait_for_function("document.getElementById('c-cumulative').data !== undefined", timeout=10_000)
    assert page.text_content("#hits") == str(len(QUESTIONS))
    assert page.text_content("#hit-ratio") == f"{100 * 3 / 8:.1f} %"  # 3 hits of 8 requests
    traces = page.evaluate("document.getElementById('c-cumulative').data.map(t => [t.name, t.y[t.y.length - 1]])")
    assert dict(traces) == {"hits": len(QUESTIONS), "misses": len(QUESTIONS) + 2, "errors": 0}
    bars = page.evaluate(
        "document.getElementById('c-requests').data.map(t => [t.name, t.y.reduce((a, b) => a + b, 0)])"
    )
    assert dict(bars) == {"exact hit": 3, "semantic hit": 0, "miss": 5, "error": 0}
    rows = page.eval_on_selector_all("#replica-rows tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
    assert [(r[0], r[1], r[3]) for r in rows] == [("local/r1", "up", "1"), ("local/r2", "up", "1")]
    assert errors == []
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    context.close()


def test_wrong_key_gets_a_sign_in_prompt(browser: Browser, proxy: Proxy) -> None:
    assert proxy.chat(QUESTIONS[0], key=KEY).status_code == 200
    context = browser.new_context(http_credentials={"username": "ops", "password": "wrong-key"})
    page = context.new_page()
    response = page.goto(proxy.url + "/ui")
    assert response is not None and response.status == 401
    assert response.headers["www-authenticate"].startswith("Basic")  # what makes a browser ask for a key
    assert "sign in" in (page.text_content("#login") or "")
    assert page.query_selector("#hits") is None and page.query_selector("#c-requests") is None
    for path in ("/v1/stats", "/ui/dashboard.js"):  # no key at all: refused too, no data
        refused = context.request.get(proxy.url + path, headers={"authorization": ""})
        assert refused.status == 401 and "points" not in refused.text()
    context.close()
