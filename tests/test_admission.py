"""Admission control and the event-loop lag metric, on a real proxy (uvicorn) over the fake backend."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.middleware.config import parse_config
from kvgate.middleware.errors import ConfigError
from kvgate.middleware.server.admission import AdmissionGate
from kvgate.middleware.telemetry.loop_lag import watch_loop_lag
from tests.conftest import route_config


def _limited(backend, tmp_path, limit: int) -> dict:
    raw = route_config(backend.api_base, tmp_path / "c")
    raw["server"] = {"max_in_flight": limit}
    return raw


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


async def _burst(url: str, n: int, stream: bool) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one(i: int) -> httpx.Response:
            body = {
                "model": "demo-1",
                "stream": stream,
                "messages": [{"role": "user", "content": f"slow question {i} {stream} [[sleep=1.5]]"}],
            }
            return await client.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer k"})

        return await asyncio.gather(*(one(i) for i in range(n)))


@pytest.mark.parametrize("stream", [False, True])
def test_requests_beyond_max_in_flight_get_429_with_retry_after(make_proxy, backend, tmp_path, stream):
    proxy = make_proxy(raw=_limited(backend, tmp_path, 2))
    responses = asyncio.run(_burst(proxy.url, 4, stream))
    refused = [r for r in responses if r.status_code == 429]
    served = [r for r in responses if r.status_code == 200]
    assert len(refused) == 2 and len(served) == 2, [r.status_code for r in responses]
    for r in refused:
        assert r.headers["retry-after"] == "1"
        err = r.json()["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "overloaded"
        assert "server.max_in_flight" in err["message"]
    metrics = _samples(proxy.http.get("/metrics").text)
    assert metrics[("kvgate_requests_rejected_total", (("reason", "overloaded"),))] == 2
    assert metrics[("kvgate_requests_in_flight", ())] == 0  # the served ones were let go, streams included
    # the slots are free again
    assert proxy.chat("a quick one after the burst").status_code == 200


def test_only_chat_completions_are_gated(make_proxy, backend, tmp_path):
    proxy = make_proxy(raw=_limited(backend, tmp_path, 1))
    assert proxy.http.get("/health").status_code == 200
    assert proxy.http.get("/metrics").status_code == 200
    assert proxy.chat("one at a time").status_code == 200
    assert proxy.chat("one at a time, again").status_code == 200  # sequential requests never collide


def test_max_in_flight_is_validated_and_named():
    raw = {"routes": [{"name": "r", "model": "*"}], "server": {"max_in_flight": 0}}
    with pytest.raises(ConfigError, match=r"server\.max_in_flight"):
        parse_config(raw)
    assert parse_config({"routes": [{"name": "r", "model": "*"}]}).server.max_in_flight == 512


def test_event_loop_lag_is_on_metrics(make_proxy):
    proxy = make_proxy()
    assert proxy.chat("the watcher samples faster after a request").status_code == 200
    deadline = time.time() + 10
    while True:
        metrics = _samples(proxy.http.get("/metrics").text)
        if metrics[("kvgate_event_loop_lag_seconds_count", ())] >= 2 or time.time() > deadline:
            break
        time.sleep(0.1)
    assert metrics[("kvgate_event_loop_lag_seconds_count", ())] >= 2
    assert ("kvgate_event_loop_lag_seconds_bucket", (("le", "0.005"),)) in metrics


def test_loop_lag_watcher_naps_longer_while_idle():
    """Short naps while requests are in flight or were admitted within IDLE_AFTER_S, long ones
    after; a request admitted again brings the short naps back at the next wake-up."""
    now = [0.0]
    naps: list[float] = []
    state = {"in_flight": 1, "admitted": 1}

    async def fake_sleep(seconds: float) -> None:
        naps.append(seconds)
        now[0] += seconds
        if len(naps) == 3:  # the request ends
            state["in_flight"] = 0
        if len(naps) == 40:  # a new one comes while the watcher naps
            state["admitted"] += 1
        if len(naps) >= 45:
            raise asyncio.CancelledError

    async def main() -> None:
        try:
            await watch_loop_lag(
                lambda lag: None,
                interval=0.05,
                clock=lambda: now[0],
                activity=lambda: (state["in_flight"], state["admitted"]),
                idle_interval=1.0,
                sleep=fake_sleep,
            )
        except asyncio.CancelledError:
            pass

    asyncio.run(main())
    assert naps[:3] == [0.05] * 3  # in flight
    idle_from = naps.index(1.0)
    assert abs(sum(naps[:idle_from]) - 0.15 - 1.0) < 0.051  # short naps for IDLE_AFTER_S after the last request
    assert set(naps[idle_from:40]) == {1.0}
    assert naps[40:] == [0.05] * 5  # admitted again: short naps at once


def test_loop_lag_watcher_sees_a_blocked_loop():
    lags: list[float] = []

    async def main() -> None:
        watcher = asyncio.create_task(watch_loop_lag(lags.append, interval=0.01))
        await asyncio.sleep(0.05)
        time.sleep(0.1)  # the loop is blocked: the watcher wakes ~100 ms late
        await asyncio.sleep(0.03)
        watcher.cancel()

    asyncio.run(main())
    assert max(lags) >= 0.08 and min(lags) >= 0.0


def test_gate_releases_its_slot_when_the_app_fails():
    seen: list[int] = []

    async def failing(scope, receive, send):
        seen.append(gate.in_flight)  # counted while it runs
        raise RuntimeError("boom")

    gate = AdmissionGate(failing, limit=1)

    async def main() -> None:
        with pytest.raises(RuntimeError):
            await gate({"type": "http", "path": "/v1/chat/completions"}, None, None)

    asyncio.run(main())
    assert gate.in_flight == 0 and seen == [1]
