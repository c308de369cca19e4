"""The admin API (middleware/server/admin.py): replicas added to and removed from a route while the proxy
runs, against a real proxy and fake replicas; plus Router.add_replica / remove_replica alone."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kvgate.engines.demo import Calls, create_fake_app
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import ReplicaConfig, RoutingConfig, parse_config
from kvgate.middleware.routing.router import Router
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import ServerThread

ADMIN = "admin-secret-1"
TENANT = "tenant-key-1"


class FakeReplica:
    def __init__(self, name: str) -> None:
        self.name, self.calls = name, Calls()
        self.server = ServerThread(create_fake_app(self.calls)).start()
        self.api_base = f"{self.server.url}/v1"


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[FakeReplica]]:
    reps = [FakeReplica(f"r{i}") for i in range(3)]
    yield reps
    for r in reps:
        r.server.stop()


class Proxy:
    def __init__(self, raw: dict[str, Any], worker: int | None = None) -> None:
        self.pipeline = build_pipeline(parse_config(raw))
        self.server = ServerThread(create_app(self.pipeline.config, self.pipeline, worker=worker)).start()
        self.http = httpx.Client(base_url=self.server.url, timeout=30)

    def admin(self, method: str, path: str, key: str | None = ADMIN, **kw: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {key}"} if key is not None else {}
        return self.http.request(method, f"/v1/admin{path}", headers=headers, **kw)

    def chat(self, text: str, key: str | None = None) -> httpx.Response:
        headers = {"authorization": f"Bearer {key}"} if key is not None else {}
        return self.http.post(
            "/v1/chat/completions",
            headers=headers,
            json={"model": "smol-1", "messages": [{"role": "user", "content": text}]},
        )

    def close(self) -> None:
        self.http.close()
        self.server.stop()
        self.pipeline.close()


@pytest.fixture
def make_proxy(replicas: list[FakeReplica], tmp_path) -> Iterator[Any]:
    started: list[Proxy] = []

    def make(auth: dict[str, Any] | None = None, worker: int | None = None) -> Proxy:
        raw = {
            "cache_dir": str(tmp_path / f"cache-{len(started)}"),
            "auth": {"admin_keys": [ADMIN]} if auth is None else auth,
            "routes": [
                {
                    "name": "local",
                    "model": "smol*",
                    "exact": False,
                    "semantic": {"enabled": False},
                    "backend": {"model": "openai/smollm2", "api_key": "none", "timeout": 5},
                    "replicas": [{"name": r.name, "api_base": r.api_base} for r in replicas[:2]],
                    "routing": {"policy": "round_robin"},
                },
                {
                    "name": "direct",
                    "model": "direct*",
                    "semantic": {"enabled": False},
                    "backend": {"model": "openai/x", "api_base": replicas[0].api_base},
                },
            ],
        }
        proxy = Proxy(raw, worker)
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        proxy.close()


def counts(replicas: list[FakeReplica]) -> dict[str, int]:
    return {r.name: r.calls.count for r in replicas}


def send(proxy: Proxy, n: int, tag: str) -> list[str]:
    served = []
    for i in range(n):
        resp = proxy.chat(f"{tag} question {i}")
        assert resp.status_code == 200, resp.text
        served.append(resp.headers["x-kvgate-replica"])
    return served


def test_added_replica_takes_traffic_and_removed_one_gets_none(make_proxy, replicas):
    proxy = make_proxy()
    listed = proxy.admin("GET", "/replicas")
    assert listed.status_code == 200
    assert listed.json() == {
        "routes": {
            "local": [
                {"name": "r0", "api_base": replicas[0].api_base, "events": None, "healthy": True},
                {"name": "r1", "api_base": replicas[1].api_base, "events": None, "healthy": True},
            ]
        }
    }

    added = proxy.admin(
        "POST",
        "/replicas",
        json={
            "route": "local",
            "name": "r2",
            "api_base": replicas[2].api_base,
            "api_key": "sk-r2",
            "events": "tcp://127.0.0.1:5557",
        },
    )
    assert added.status_code == 201, added.text
    body = added.json()
    assert body["route"] == "local" and "restart" in body["note"] and "YAML" in body["note"]
    assert body["replica"] == {
        "name": "r2",
        "api_base": replicas[2].api_base,
        "events": "tcp://127.0.0.1:5557",
        "healthy": True,
    }
    assert [r["name"] for r in proxy.admin("GET", "/replicas").json()["routes"]["local"]] == ["r0", "r1", "r2"]

    before = counts(replicas)
    served = send(proxy, 9, "after add")
    assert sorted(set(served)) == ["r0", "r1", "r2"]  # round robin: each replica, the new one included
    assert {n: counts(replicas)[n] - before[n] for n in before} == {"r0": 3, "r1": 3, "r2": 3}
    assert replicas[2].calls.bodies[-1]["model"] == "smollm2"  # the backend's model, as for the others
    assert 'kvgate_replica_up{replica="r2",route="local"} 1.0' in proxy.http.get("/metrics").text

    removed = proxy.admin("DELETE", "/replicas/local/r0")
    assert removed.status_code == 200, removed.text
    assert removed.json()["removed"] == "r0" and "restart" in removed.json()["note"]
    before = counts(replicas)
    served = send(proxy, 8, "after remove")
    assert "r0" not in served and counts(replicas)["r0"] == before["r0"]
    assert counts(replicas)["r1"] - before["r1"] == counts(replicas)["r2"] - before["r2"] == 4
    assert 'replica="r0"' not in proxy.http.get("/metrics").text.split("kvgate_replica_up", 1)[1].split("# HELP")[0]
    assert [r["name"] for r in proxy.admin("GET", "/replicas").json()["routes"]["local"]] == ["r1", "r2"]

    # a removed name can come back
    assert (
        proxy.admin(
            "POST", "/replicas", json={"route": "local", "name": "r0", "api_base": replicas[0].api_base}
        ).status_code
        == 201
    )
    assert "r0" in send(proxy, 3, "back again")


def test_a_request_in_flight_on_a_removed_replica_finishes(make_proxy, replicas):
    proxy = make_proxy()
    before = counts(replicas)
    result: dict[str, httpx.Response] = {}
    slow = threading.Thread(target=lambda: result.setdefault("r", proxy.chat("slow one [[sleep=1.0]]")))
    slow.start()
    for _ in range(200):  # until the slow request has reached its replica
        busy = [n for n, c in counts(replicas).items() if c > before[n]]
        if busy:
            break
        threading.Event().wait(0.01)
    assert len(busy) == 1
    assert proxy.admin("DELETE", f"/replicas/local/{busy[0]}").status_code == 200
    slow.join(10)
    assert result["r"].status_code == 200 and result["r"].headers["x-kvgate-replica"] == busy[0]
    assert busy[0] not in send(proxy, 4, "after")


def test_workers_refuse_changes(make_proxy, replicas):
    """One worker of `kvgate serve --workers N`: a change would reach that worker only."""
    proxy = make_proxy(worker=0)
    assert proxy.admin("GET", "/replicas").status_code == 200
    add = error(
        proxy.admin("POST", "/replicas", json={"route": "local", "name": "r2", "api_base": replicas[2].api_base}), 409
    )
    assert "--workers" in add["message"]
    error(proxy.admin("DELETE", "/replicas/local/r0"), 409)
    assert len(proxy.admin("GET", "/replicas").json()["routes"]["local"]) == 2


def test_admin_keys(make_proxy):
    proxy = make_proxy()
    assert proxy.admin("GET", "/replicas", key=None).status_code == 401
    wrong = proxy.admin("GET", "/replicas", key="not-it")
    assert wrong.status_code == 403 and wrong.json()["error"]["message"] == "not an admin key (auth.admin_keys)"
    assert proxy.admin("GET", "/replicas", key=ADMIN + "x").status_code == 403
    refused = proxy.admin(
        "POST", "/replicas", key="not-it", json={"route": "local", "name": "rx", "api_base": "http://127.0.0.1:9/v1"}
    )
    assert refused.status_code == 403 and "rx" not in proxy.admin("GET", "/replicas").text

    off = make_proxy(auth={})  # no admin_keys: never open by default
    for key in (None, ADMIN, "anything"):
        resp = off.admin("GET", "/replicas", key=key)
        assert resp.status_code == 403, key
        assert "set auth.admin_keys" in resp.json()["error"]["message"]
    assert off.admin("DELETE", "/replicas/local/r0").status_code == 403
    assert len(off.admin("GET", "/replicas").json()["error"]) == 4  # OpenAI error JSON, not a listing


def test_every_admin_route_needs_an_admin_key(make_proxy):
    """Walks the app's routes, so an admin route added later is covered without editing this."""
    proxy = make_proxy()
    paths = [
        (m, r.path.replace("{", "").replace("}", ""))
        for r in proxy.server.config.app.routes
        if r.path.startswith("/v1/admin/")
        for m in r.methods
    ]
    assert {m for m, _ in paths} == {"GET", "POST", "DELETE"}
    for method, path in paths:
        url = path.removeprefix("/v1/admin")
        assert proxy.admin(method, url, key=None, json={}).status_code == 401, (method, path)
        assert proxy.admin(method, url, key="not-it", json={}).status_code == 403, (method, path)


def test_admin_keys_with_tenant_keys(make_proxy):
    """With auth.keys set, the proxy's key gate lets an admin key through on admin paths only,
    and the admin API refuses a tenant key."""
    proxy = make_proxy(auth={"keys": [TENANT], "admin_keys": [ADMIN]})
    assert proxy.admin("GET", "/replicas").status_code == 200
    assert proxy.admin("GET", "/replicas", key=TENANT).status_code == 403
    no_key = proxy.admin("GET", "/replicas", key=None)
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"
    assert proxy.admin("GET", "/replicas", key="neither").status_code == 401
    assert proxy.chat("hello", key=ADMIN).status_code == 401  # an admin key is not a tenant key
    assert proxy.http.get("/metrics", headers={"authorization": f"Bearer {ADMIN}"}).status_code == 401
    assert proxy.chat("hello", key=TENANT).status_code == 200


def error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_refusals(make_proxy, replicas):
    proxy = make_proxy()
    r2 = replicas[2].api_base
    assert (
        error(proxy.admin("POST", "/replicas", json={"route": "local", "name": "r1", "api_base": r2}), 409)["param"]
        == "name"
    )
    assert (
        error(proxy.admin("POST", "/replicas", json={"route": "nope", "name": "r2", "api_base": r2}), 404)["param"]
        == "route"
    )
    no_routing = error(proxy.admin("POST", "/replicas", json={"route": "direct", "name": "r2", "api_base": r2}), 400)
    assert no_routing["param"] == "route" and "no replicas" in no_routing["message"]
    error(proxy.admin("DELETE", "/replicas/nope/r0"), 404)
    error(proxy.admin("DELETE", "/replicas/direct/r0"), 400)
    assert error(proxy.admin("DELETE", "/replicas/local/r9"), 404)["param"] == "name"
    assert proxy.admin("DELETE", "/replicas/local/r1").status_code == 200
    last = error(proxy.admin("DELETE", "/replicas/local/r0"), 409)
    assert "last replica" in last["message"]
    assert send(proxy, 2, "still routed") == ["r0", "r0"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"route": "local", "name": "r2"}, "api_base"),
        ({"route": "local", "api_base": "http://127.0.0.1:9/v1"}, "name"),
        ({"name": "r2", "api_base": "http://127.0.0.1:9/v1"}, "route"),
        ({"route": "local", "name": "", "api_base": "http://127.0.0.1:9/v1"}, "name"),
        ({"route": "local", "name": "r2", "api_base": "127.0.0.1:9/v1"}, "api_base"),
        (
            {"route": "local", "name": "r2", "api_base": "http://127.0.0.1:9/v1", "capacity_blocks": 0},
            "capacity_blocks",
        ),
        ({"route": "local", "name": "r2", "api_base": "http://127.0.0.1:9/v1", "weight": 2}, "weight"),
    ],
)
def test_validation_names_the_field(make_proxy, body, field):
    proxy = make_proxy()
    err = error(proxy.admin("POST", "/replicas", json=body), 400)
    assert err["param"] == field and f": {field}: " in err["message"], err
    assert [r["name"] for r in proxy.admin("GET", "/replicas").json()["routes"]["local"]] == ["r0", "r1"]


def test_bad_bodies(make_proxy):
    proxy = make_proxy()
    assert "not valid JSON" in error(proxy.admin("POST", "/replicas", content=b"{nope"), 400)["message"]
    assert "JSON object" in error(proxy.admin("POST", "/replicas", json=["local"]), 400)["message"]


class FixedState:
    """A routing state laid out at start-up, like WorkerState: an unknown name is a KeyError."""

    shared = True

    def __init__(self, names: list[str]) -> None:
        self.counts = {n: [0, 0] for n in names}

    def add_load(self, replica: str, in_flight: int, pending: int) -> None:
        self.counts[replica][0] += in_flight

    def load(self, replica: str) -> tuple[int, int]:
        return self.counts[replica][0], self.counts[replica][1]

    def recorded(self, replica: str, hashes: Any) -> None: ...
    def follow(self, apply: Any) -> None: ...
    def close(self) -> None: ...


def test_router_add_and_remove():
    reps = [ReplicaConfig(name=n, api_base=f"http://{n}/v1") for n in ("a", "b")]
    router = Router(reps, RoutingConfig(policy="round_robin"))
    messages = [{"role": "user", "content": "a prompt long enough to fill a few blocks " * 4}]
    ticket = router.started(router.replicas[0], router.plan(messages))
    added = router.add_replica(ReplicaConfig(name="c", api_base="http://c/v1", capacity_blocks=7))
    assert [r.name for r in router.replicas] == ["a", "b", "c"] and added.name == "c"
    assert router.index.capacity("c") == 7 and router.state.load("c") == (0, 0)
    router.started(added, router.plan(messages))
    assert router.index.blocks("c") > 0 and router.stats()["c"]["in_flight"] == 1
    with pytest.raises(ValueError):
        router.add_replica(ReplicaConfig(name="c", api_base="http://c2/v1"))

    snapshot = router.replicas
    router.remove_replica("a")
    assert [r.name for r in snapshot] == ["a", "b", "c"]  # a reader's snapshot is left as it was
    assert [r.name for r in router.replicas] == ["b", "c"] and "a" not in router.index.replicas
    router.finished(ticket, ok=True)  # in flight on the removed replica: its books still balance
    assert ticket.replica.in_flight == 0 and router.state.load("a") == (0, 0)
    with pytest.raises(KeyError):
        router.remove_replica("a")
    router.remove_replica("c")
    with pytest.raises(ValueError):
        router.remove_replica("b")
    router.close()


def test_router_refuses_names_a_fixed_state_cannot_count():
    reps = [ReplicaConfig(name="a", api_base="http://a/v1")]
    router = Router(reps, RoutingConfig(policy="round_robin"), state=FixedState(["a"]))
    with pytest.raises(ValueError, match="FixedState cannot count"):
        router.add_replica(ReplicaConfig(name="b", api_base="http://b/v1"))
    assert [r.name for r in router.replicas] == ["a"] and router.index.replicas == ["a"]
    router.close()
