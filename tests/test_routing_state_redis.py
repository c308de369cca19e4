"""The shared routing view on a real Redis: two proxies' Routers (each with its own link and hub)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kvgate.index.storage.redis_link import LinkSettings, RedisLink
from kvgate.middleware.config import ConfigError, ReplicaConfig, RoutingConfig, load_config
from kvgate.middleware.routing.router import Router
from kvgate.middleware.routing.state_redis import RedisRoutingHub, sum_loads
from kvgate.middleware.store_config import SharedRoutingConfig
from tests.conftest import wait_until

REPLICAS = [ReplicaConfig(name=f"r{i}", api_base=f"http://127.0.0.1:{9000 + i}/v1") for i in range(2)]
CFG = SharedRoutingConfig(sync_s=0.05, load_ttl_s=0.6)
ROOT = Path(__file__).resolve().parents[1]


def _link(url: str) -> RedisLink:
    return RedisLink(LinkSettings(url, connect_timeout_s=0.2, op_timeout_s=0.2, backoff_min_s=0.05, backoff_max_s=0.2))


@pytest.fixture()
def proxies(redis_server):
    """Two proxies' hubs on one Redis; each proxy has its own connection pool."""
    links = [_link(redis_server.url) for _ in range(2)]
    hubs = [RedisRoutingHub(link, "t:", CFG) for link in links]
    yield hubs
    for hub, link in zip(hubs, links):
        hub.close()
        link.close()


def _router(hub: RedisRoutingHub) -> Router:
    cfg = RoutingConfig(policy="cache_aware", prefix={"tokenizer": "text", "block_size": 4})
    return Router(REPLICAS, cfg, state=hub.state("chat", ["r0", "r1"]))


STALENESS = 2 * CFG.sync_s + 2 * 0.2 + 0.5  # two syncs + two op timeouts, plus slack for a busy machine


def test_a_decision_in_one_proxy_steers_the_other(proxies) -> None:
    one, two = _router(proxies[0]), _router(proxies[1])
    chat = [{"role": "user", "content": "a long shared system prompt " * 8}]
    plan = one.plan(chat)
    ticket = one.started(one.replicas[1], plan)
    one.finished(
        ticket, ok=True, hashes=one.answer_hashes(plan, [*chat, {"role": "assistant", "content": "the answer " * 6}])
    )
    assert wait_until(lambda: proxies[1].received >= 2, 5.0)
    follow_up = [*chat, {"role": "assistant", "content": "the answer " * 6}, {"role": "user", "content": "and then?"}]
    fplan = two.plan(follow_up)
    assert fplan.matched_blocks["r1"] > len(plan.hashes) and fplan.matched_blocks["r0"] == 0
    assert two.choose(fplan).name == "r1"
    assert proxies[0].received == 0  # its own records are not applied twice


def test_the_other_proxy_sees_in_flight_within_the_bound(proxies) -> None:
    one, two = _router(proxies[0]), _router(proxies[1])
    plan = one.plan([{"role": "user", "content": "x" * 64}])
    ticket = one.started(one.replicas[0], plan)
    assert one.stats()["r0"]["in_flight"] == 1  # its own change, at once
    assert wait_until(
        lambda: (
            two.stats()["r0"] == {**two.stats()["r0"], "in_flight": 1, "pending_prefill_tokens": plan.prompt_tokens}
        ),
        STALENESS,
    )
    # B's choice avoids the replica A loaded, though B sent nothing itself
    assert two.choose(two.plan([{"role": "user", "content": "y" * 64}])).name == "r1"
    one.finished(ticket, ok=True)
    assert wait_until(
        lambda: two.stats()["r0"]["in_flight"] == 0 and two.stats()["r0"]["pending_prefill_tokens"] == 0, STALENESS
    )


DEAD_PROXY = """
import sys, time
from kvgate.index.storage.redis_link import LinkSettings, RedisLink
from kvgate.middleware.store_config import SharedRoutingConfig
from kvgate.middleware.routing.state_redis import RedisRoutingHub
hub = RedisRoutingHub(RedisLink(LinkSettings(sys.argv[1])), "t:", SharedRoutingConfig(sync_s=0.05, load_ttl_s=0.6))
hub.state("chat", ["r0", "r1"]).add_load("r0", 3, 300)
while hub.syncs < 2:
    time.sleep(0.01)
print("pushed", flush=True)
time.sleep(60)
"""


def test_a_dead_proxys_load_expires(proxies, redis_server) -> None:
    two = _router(proxies[1])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", DEAD_PROXY, redis_server.url], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"pushed"
        assert wait_until(lambda: two.stats()["r0"]["in_flight"] == 3, STALENESS)
        proc.send_signal(signal.SIGKILL)  # no goodbye: its hash must expire by itself
        proc.wait(5)
        assert wait_until(lambda: two.stats()["r0"]["in_flight"] == 0, CFG.load_ttl_s + STALENESS)
        assert two.stats()["r0"]["pending_prefill_tokens"] == 0
    finally:
        proc.kill()
        proc.wait(5)


def test_redis_killed_routing_goes_on_locally_then_sharing_resumes(proxies, redis_server) -> None:
    one, two = _router(proxies[0]), _router(proxies[1])
    t1 = one.started(one.replicas[0], one.plan([{"role": "user", "content": "before " * 10}]))
    assert wait_until(lambda: two.stats()["r0"]["in_flight"] == 1, STALENESS)
    assert redis_server.proc is not None
    redis_server.proc.kill()
    redis_server.proc.wait(5)
    # routing goes on in both, from local state only; no call raises
    chat = [{"role": "user", "content": "during the outage " * 6}]
    ticket = two.started(two.choose(two.plan(chat)), two.plan(chat))
    two.finished(ticket, ok=True)
    assert wait_until(
        lambda: two.stats()["r0"]["in_flight"] == 0, CFG.load_ttl_s + STALENESS
    )  # A's load: stale, dropped
    assert one.stats()["r0"]["in_flight"] == 1  # A's own count is never stale
    assert proxies[0]._link.errors.get("routing_push", 0) > 0 and not proxies[0]._link.up
    one.finished(t1, ok=True)

    redis_server.restart()  # empty
    received = proxies[1].received
    later = [{"role": "user", "content": "after the restart " * 6}]
    one.finished(one.started(one.replicas[1], one.plan(later)), ok=True)
    assert wait_until(lambda: proxies[1].received > received, 5.0)
    assert two.plan(later).matched_blocks["r1"] > 0
    t2 = one.started(one.replicas[0], one.plan([{"role": "user", "content": "load again " * 8}]))
    assert wait_until(lambda: two.stats()["r0"]["in_flight"] == 1, 5.0)
    one.finished(t2, ok=True)
    assert proxies[0]._link.up


def test_a_proxy_that_starts_late_learns_the_recent_history(proxies, redis_server) -> None:
    one, _two = _router(proxies[0]), _router(proxies[1])
    chat = [{"role": "user", "content": "an old conversation " * 6}]
    one.finished(one.started(one.replicas[1], one.plan(chat)), ok=True)
    assert wait_until(lambda: proxies[1].received >= 1, 5.0)  # in the stream by now
    link = _link(redis_server.url)
    late = RedisRoutingHub(link, "t:", CFG)
    try:
        three = _router(late)
        assert wait_until(lambda: late.received >= 1, 5.0)
        assert three.choose(three.plan(chat)).name == "r1"
    finally:
        late.close()
        link.close()


def test_sum_loads_skips_malformed_values() -> None:
    assert sum_loads([{b"a\x00r0": b"1,10"}, {b"a\x00r0": b"2,5", b"a\x00r1": b"junk"}]) == {"a\x00r0": (3, 15)}


def test_bad_shared_routing_config_names_the_field(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "routes: [{name: r, model: '*', backend: {model: openai/x}}]\n"
        "store: {backend: redis, url: 'redis://127.0.0.1:1/0', routing: {sync_s: 1, load_ttl_s: 1}}\n"
    )
    with pytest.raises(ConfigError, match="load_ttl_s"):
        load_config(cfg)


def test_pipelines_on_a_redis_store_share_their_routing_view(redis_server, tmp_path: Path) -> None:
    """`store.backend: redis` is enough: each Pipeline's routers get the Redis state, no extra wiring."""
    from kvgate.middleware.build import build_pipeline

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "routes: [{name: chat, model: '*', backend: {model: openai/x, api_key: none}, exact: false,\n"
        "          semantic: {enabled: false}, routing: {prefix: {tokenizer: text, block_size: 4}},\n"
        "          replicas: [{name: r0, api_base: 'http://127.0.0.1:9/v1'}, {name: r1, api_base: 'http://127.0.0.1:8/v1'}]}]\n"
        f"store: {{backend: redis, url: '{redis_server.url}', routing: {{sync_s: 0.05, load_ttl_s: 0.6}}}}\n"
    )
    one, two = build_pipeline(load_config(cfg)), build_pipeline(load_config(cfg))
    try:
        a, b = one.routers["chat"], two.routers["chat"]
        chat = [{"role": "user", "content": "through the pipeline " * 6}]
        ticket = a.started(a.replicas[1], a.plan(chat))
        assert wait_until(lambda: b.stats()["r1"]["in_flight"] == 1, STALENESS)
        a.finished(ticket, ok=True)
        assert wait_until(lambda: b.plan(chat).matched_blocks["r1"] > 0, 5.0)
    finally:
        one.close()
        two.close()
