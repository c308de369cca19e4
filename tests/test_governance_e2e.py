"""Erasing a tenant and invalidating tags through the real proxy (disk and real Redis stores), a
fake vLLM replica (it answers /version and reports a model `root`, and records each forwarded
body's cache_salt), the SDK in process and `kvgate admin` against the proxy."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
from conftest import wait_until
from fastapi import FastAPI

from kvgate.engines.demo import Calls, create_fake_app
from kvgate.index.responses.tags import system_tag
from kvgate.middleware.cli import main as kvgate_main
from kvgate.middleware.sdk.admin_client import tenant_id
from kvgate.middleware.sdk.client import Gateway, cache_info
from kvgate.tools.bench.procs import ServerThread

ADMIN, KEY_A, KEY_B = "admin-key-e2e", "tenant-key-a", "tenant-key-b"
CANARY = f"CANARY-{uuid.uuid4().hex[:12]}"
SYSTEM = "You answer in one sentence."


class FakeVllm:
    """demo's fake backend dressed as vLLM 0.32: /version, and /v1/models with a `root` a test moves."""

    def __init__(self) -> None:
        self.calls = Calls()
        self.root = "/models/smol@rev1"
        app: FastAPI = create_fake_app(self.calls)
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", "") != "/v1/models"]

        @app.get("/version")
        async def version() -> dict[str, Any]:
            return {"version": "0.32.0"}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": "smol", "object": "model", "root": self.root}]}

        self.server = ServerThread(app).start()
        self.api_base = f"{self.server.url}/v1"

    def last_salt(self) -> str | None:
        return self.calls.bodies[-1].get("cache_salt")


@pytest.fixture
def vllm() -> Iterator[FakeVllm]:
    fake = FakeVllm()
    yield fake
    fake.server.stop()


def governance_config(cache_dir: Path, vllm: FakeVllm, backend_base: str, redis_url: str | None) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "cache_dir": str(cache_dir),
        "auth": {"keys": [KEY_A, KEY_B], "admin_keys": [ADMIN]},
        "routes": [
            {
                "name": "chat",
                "model": "demo-*",
                "scope": "tenant",
                "semantic": {"threshold": 0.9},
                "backend": {"model": "openai/smol", "api_key": "none"},
                "replicas": [{"name": "v1", "api_base": vllm.api_base}],
                "routing": {"engine": "vllm", "policy": "round_robin", "probe_interval_s": 0.1},
            },
            {
                "name": "shared",
                "model": "shared-*",
                "scope": "shared",
                "semantic": {"enabled": False},
                "backend": {"model": "openai/served-name", "api_base": backend_base, "api_key": "sk-x"},
            },
        ],
    }
    if redis_url is not None:
        raw["store"] = {"backend": "redis", "url": redis_url, "follow_interval_s": 0.05}
    return raw


def raw_disk(directory: Path) -> bytes:
    return b"\n".join(p.read_bytes() for p in directory.rglob("*") if p.is_file())


def raw_redis(url: str) -> bytes:
    """Every key and every value of every type, as Redis returns them."""
    import redis

    client = redis.Redis.from_url(url)
    out: list[bytes] = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        out.append(key)
        if kind == b"string":
            out.append(client.get(key) or b"")
        elif kind == b"hash":
            out += [x for pair in client.hgetall(key).items() for x in pair]
        elif kind == b"set":
            out += list(client.smembers(key))
        elif kind == b"zset":
            out += list(client.zrange(key, 0, -1))
        elif kind == b"list":
            out += list(client.lrange(key, 0, -1))
        elif kind == b"stream":
            out += [repr(row).encode() for row in client.xrange(key)]
    client.close()
    return b"\n".join(out)


def cache_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.headers["x-kvgate-cache"]


@pytest.mark.parametrize("store", ["local", "redis"])
def test_erase_a_tenant_everywhere_and_no_one_else(
    store: str,
    make_proxy: Callable[..., Any],
    vllm: FakeVllm,
    backend: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    redis_url = request.getfixturevalue("redis_server").url if store == "redis" else None
    proxy = make_proxy(raw=governance_config(tmp_path / "cache", vllm, backend.api_base, redis_url))
    tagged = {"x-kvgate-tags": "doc:1@v1"}
    q1, q1b = f"{CANARY}: what is the capital of France?", f"{CANARY}: what is the capital of France??"
    assert cache_of(proxy.chat(q1, key=KEY_A, headers=tagged)) == "miss"
    salt_before = vllm.last_salt()
    assert salt_before
    hit = proxy.chat(q1, key=KEY_A)
    assert (
        cache_of(hit) == "exact" and hit.headers["x-kvgate-entry-id"] and float(hit.headers["x-kvgate-entry-age"]) >= 0
    )
    near = proxy.chat(q1b, key=KEY_A)  # a semantic hit, judged wrong: a feedback mark of tenant A
    assert cache_of(near) == "semantic"
    verdict = proxy.http.post(
        "/v1/cache/feedback",
        headers={"authorization": f"Bearer {KEY_A}"},
        json={"request_id": near.headers["x-kvgate-request-id"], "correct": False},
    )
    assert verdict.status_code == 200 and verdict.json()["removed"]
    assert cache_of(proxy.chat(q1, key=KEY_A, headers=tagged)) == "miss"  # stored again
    assert cache_of(proxy.chat(f"{CANARY} on the shared route", key=KEY_A, model="shared-1")) == "miss"
    b_question = "Which river flows through Madrid?"
    for key, want in ((KEY_B, "miss"), (KEY_B, "exact")):
        assert cache_of(proxy.chat(b_question, key=key, headers=tagged)) == want
    assert cache_of(proxy.chat("B on the shared route", key=KEY_B, model="shared-1")) == "miss"
    seen = raw_redis(redis_url) if redis_url else raw_disk(tmp_path / "cache")
    assert CANARY.encode() in seen  # the scan below would find it

    assert (
        proxy.http.delete(
            f"/v1/admin/tenants/{tenant_id(KEY_A)}", headers={"authorization": f"Bearer {KEY_B}"}
        ).status_code
        == 403
    )
    erased = proxy.http.delete(f"/v1/admin/tenants/{tenant_id(KEY_A)}", headers={"authorization": f"Bearer {ADMIN}"})
    assert erased.status_code == 200, erased.text
    body = erased.json()
    assert body["object"] == "tenant.erased" and body["tenant"] == tenant_id(KEY_A)
    assert body["erased"]["entries"] == 2 and body["erased"]["vectors"] == 1  # q1 (chat) and the shared-route one
    assert body["erased"]["feedback_marks"] == 1 and body["erased"]["request_log"] == 5  # A's five requests
    assert body["salt_epoch"] == 1 and body["scrubbed"] is True

    assert CANARY.encode() not in raw_disk(tmp_path / "cache")
    if redis_url:
        assert CANARY.encode() not in raw_redis(redis_url)
    # every layer misses for A, under a new salt; B keeps every entry
    assert cache_of(proxy.chat(q1, key=KEY_A)) == "miss" and vllm.last_salt() not in (None, salt_before)
    assert cache_of(proxy.chat(f"{CANARY} on the shared route", key=KEY_A, model="shared-1")) == "miss"
    assert cache_of(proxy.chat(b_question, key=KEY_B)) == "exact"
    assert cache_of(proxy.chat("B on the shared route", key=KEY_B, model="shared-1")) == "exact"


@pytest.mark.parametrize("store", ["local", "redis"])
def test_proxies_on_one_store_salt_a_tenant_alike_across_restarts(
    store: str,
    make_proxy: Callable[..., Any],
    vllm: FakeVllm,
    backend: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    redis_url = request.getfixturevalue("redis_server").url if store == "redis" else None
    raw = governance_config(tmp_path / "cache", vllm, backend.api_base, redis_url)
    first, second = make_proxy(raw=raw), make_proxy(raw=raw)

    def salt_of(proxy: Any, key: str) -> str | None:
        forwarded = proxy.chat("Name a colour.", key=key, headers={"x-kvgate-cache-control": "no-cache, no-store"})
        assert forwarded.status_code == 200, forwarded.text
        return vllm.last_salt()

    a = salt_of(first, KEY_A)
    assert a and salt_of(second, KEY_A) == a and salt_of(second, KEY_B) not in (None, a)
    first.stop()
    second.stop()
    assert salt_of(make_proxy(raw=raw), KEY_A) == a  # the record outlives the processes


@pytest.mark.parametrize("store", ["local", "redis"])
def test_invalidate_by_client_tag_system_prompt_and_model_revision(
    store: str,
    make_proxy: Callable[..., Any],
    vllm: FakeVllm,
    backend: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    redis_url = request.getfixturevalue("redis_server").url if store == "redis" else None
    proxy = make_proxy(raw=governance_config(tmp_path / "cache", vllm, backend.api_base, redis_url))
    tagged = {"x-kvgate-tags": "doc:7@v2, team:red"}
    qa, qb = "How many moons has Mars?", "How tall is Mont Blanc?"
    for q, key in ((qa, KEY_A), (qb, KEY_B)):
        assert cache_of(proxy.chat(q, key=key, headers=tagged)) == "miss"
        assert cache_of(proxy.chat(q, key=key)) == "exact"

    def invalidate(key: str, path: str = "/v1/admin/invalidate", **body: Any) -> httpx.Response:
        return proxy.http.post(path, headers={"authorization": f"Bearer {key}"}, json=body)

    for path in ("/v1/admin/invalidate", "/v1/cache/invalidate"):  # a tenant key: never another tenant's
        refused = invalidate(KEY_B, path, tags=["doc:7@v2"], tenant=tenant_id(KEY_A))
        assert refused.status_code == 403 and refused.json()["error"]["param"] == "tenant"
    assert invalidate("not-a-key", tags=["doc:7@v2"]).status_code == 401
    assert invalidate(KEY_B, "/v1/cache/invalidate", tags=["doc:none@v1"]).json()["removed"] == 0
    own = invalidate(KEY_B, tags=["doc:7@v2"])  # a tenant key: its own entries only
    assert own.status_code == 200 and own.json() == {
        "object": "cache.invalidated",
        "tags": ["doc:7@v2"],
        "tenant": tenant_id(KEY_B),
        "removed": 1,
    }
    assert cache_of(proxy.chat(qa, key=KEY_A)) == "exact" and cache_of(proxy.chat(qb, key=KEY_B)) == "miss"
    assert invalidate(ADMIN, tags=["team:red"]).json()["removed"] == 1  # an admin: every tenant's
    assert cache_of(proxy.chat(qa, key=KEY_A)) == "miss"
    bad = invalidate(ADMIN, tags=["tenant:x"])
    assert bad.status_code == 400 and "kvgate's own" in bad.json()["error"]["message"]
    bad_header = proxy.chat(qa, key=KEY_A, headers={"x-kvgate-tags": "doc 1"})
    assert bad_header.status_code == 400 and bad_header.json()["error"]["param"] == "x-kvgate-tags"

    # the system prompt's hash
    conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a prime."}]
    assert cache_of(proxy.chat(conversation, key=KEY_A)) == "miss"
    assert cache_of(proxy.chat(conversation, key=KEY_A)) == "exact"
    assert invalidate(ADMIN, tags=[system_tag(SYSTEM)]).json()["removed"] == 1
    assert cache_of(proxy.chat(conversation, key=KEY_A)) == "miss"

    # the model revision: the engine restarts with other weights; nothing made before is served
    router = proxy.pipeline.routers["chat"]
    assert router.model_revision == "/models/smol@rev1"
    assert cache_of(proxy.chat(qb, key=KEY_B)) == "exact" and cache_of(proxy.chat(conversation, key=KEY_A)) == "exact"
    vllm.root = "/models/smol@rev2"
    assert wait_until(lambda: router.model_revision == "/models/smol@rev2", timeout=10)
    for q, key in ((qb, KEY_B), (conversation, KEY_A)):
        assert cache_of(proxy.chat(q, key=key)) == "miss"
        assert cache_of(proxy.chat(q, key=key)) == "exact"  # made with rev2: served
    assert invalidate(ADMIN, tags=["model:/models/smol@rev2"]).json()["removed"] == 2


def test_cli_admin_commands(
    make_proxy: Callable[..., Any],
    vllm: FakeVllm,
    backend: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    proxy = make_proxy(raw=governance_config(tmp_path / "cache", vllm, backend.api_base, None))
    assert cache_of(proxy.chat("Spell cat.", key=KEY_A, headers={"x-kvgate-tags": "doc:9"})) == "miss"
    monkeypatch.setenv("KVGATE_ADMIN_KEY", ADMIN)
    monkeypatch.setenv("TENANT_A_KEY", KEY_A)
    assert kvgate_main(["admin", "tenant-id", "--tenant-key-env", "TENANT_A_KEY"]) == 0
    assert capsys.readouterr().out.strip() == tenant_id(KEY_A)
    monkeypatch.setenv("TENANT_B_KEY", KEY_B)
    assert (
        kvgate_main(["admin", "invalidate", "--url", proxy.url, "--tag", "doc:9", "--own", "--key-env", "TENANT_B_KEY"])
        == 0
    )  # B's own: A's entry stays
    assert json.loads(capsys.readouterr().out)["removed"] == 0
    assert kvgate_main(["admin", "invalidate", "--url", proxy.url, "--tag", "doc:9"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 1
    assert kvgate_main(["admin", "erase-tenant", "--url", proxy.url, "--tenant-key-env", "TENANT_A_KEY"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tenant"] == tenant_id(KEY_A) and out["salt_epoch"] == 1 and out["erased"]["request_log"] == 1
    monkeypatch.setenv("KVGATE_ADMIN_KEY", KEY_B)  # a tenant key cannot erase
    assert kvgate_main(["admin", "erase-tenant", "--url", proxy.url, tenant_id(KEY_A)]) == 1
    assert "403" in capsys.readouterr().err
    monkeypatch.delenv("KVGATE_ADMIN_KEY")
    assert kvgate_main(["admin", "invalidate", "--url", proxy.url, "--tag", "x"]) == 2


def test_sdk_tags_invalidate_and_erase_in_process(backend: Any, tmp_path: Path) -> None:
    config = {
        "cache_dir": str(tmp_path / "cache"),
        "routes": [
            {
                "name": "r",
                "model": "demo-*",
                "semantic": {"enabled": False},
                "backend": {"model": "openai/served-name", "api_base": backend.api_base, "api_key": "x"},
            }
        ],
    }
    with Gateway(config, tenant="acme") as gw:
        ask = {"model": "demo-1", "messages": [{"role": "user", "content": f"{CANARY} sdk"}]}
        assert cache_info(gw.completion(**ask, cache_tags=["doc:5"])).cache == "miss"
        served = gw.completion(**ask)
        info = cache_info(served)
        assert info.cache == "exact" and info.entry_id is not None and info.entry_age_s is not None
        with pytest.raises(Exception, match="kvgate's own"):
            gw.completion(**ask, cache_tags=["model:x"])
        assert gw.invalidate(["doc:5"], tenant="someone-else").removed == 0
        assert gw.invalidate(["doc:5"]).removed == 1
        assert cache_info(gw.completion(**ask)).cache == "miss"
        erased = gw.erase_tenant("acme")
        assert erased.entries == 1 and erased.request_log == 3 and erased.salt_epoch == 1
        assert cache_info(gw.completion(**ask)).cache == "miss"
    assert gw.pipeline.governance is not None
