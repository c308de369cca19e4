"""The services `kvgate bench governance`'s erase and invalidate parts run against.

One real Redis (tools/redis_proc.py); two engines (governance_engines.py: real vLLM with kvgate's
KV connector over an encrypted disk tier and an encrypted Redis tier, or fake ones for a quick
run); two real `kvgate serve` processes in front of both engines, one whose response cache is the
local disk store and one whose response cache is on the Redis: so the response cache and the KV
tiers are each covered on disk and on Redis. Both proxies: `scope: tenant` (every tenant its own
entries and its own engine `cache_salt`), precise routing on the engines' KV events (vLLM) or
round robin (fake engines), encryption at rest (`encryption.key_env`), one salt secret given by
`auth.salt_secret_env` (so the bench, holding it, can derive a tenant's salts from what the stores
hold, to try reading its chunks), tenant keys and an admin key. Each proxy keeps the tenants' salt
records in its own store (the disk one in its cache_dir, the Redis one on the Redis), so the two
salt a tenant differently.

The master key and the salt secret are made per run and handed to the child processes in their
environment only.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx

MASTER_ENV = "KVGATE_BENCH_MASTER_KEY"
SALT_ENV = "KVGATE_BENCH_SALT_SECRET"
MODEL = "smollm2"  # the engines' served model name
STORES = ("disk", "redis")
TENANTS = ("a", "b", "c", "warm")  # a: erased; b: the other tenant; c: invalidation; warm: warm-up only
PROBE_S = 0.5  # the proxies' health round: how soon a restarted engine's revision is asked again
ACK = "Noted."
# answers end at a stop string ("stop": cacheable), not at max_tokens ("length": never cached)
STOP = ["."]


@dataclass
class Reply:
    cache: str  # x-kvgate-cache: miss, exact, semantic
    entry_id: int | None  # x-kvgate-entry-id: the entry that served a hit
    replica: str | None  # x-kvgate-replica: the engine that answered a miss
    cached_tokens: int  # usage.prompt_tokens_details.cached_tokens (of the stored answer, on a hit)
    prompt_tokens: int
    text: str

    @property
    def hit(self) -> bool:
        return self.cache != "miss"


def document(seed: int, tokens: int, canary: str | None = None) -> str:
    """A long first turn of facts, distinct per seed; with `canary`, an access code that names it."""
    from kvgate.tools.bench.vllm_kv_client import first_message

    body = first_message(seed, tokens)
    return f"The access code is {canary}. {body}" if canary else body


def conversation(doc: str, question: str, system: str | None = None) -> list[dict[str, str]]:
    """doc as an earlier turn (so it is in the entry's scope: no two documents share semantic
    matches) and the question last."""
    head = [{"role": "system", "content": system}] if system else []
    return head + [
        {"role": "user", "content": doc},
        {"role": "assistant", "content": ACK},
        {"role": "user", "content": question},
    ]


def proxy_config(
    store: str, cache_dir: Path, engines: Any, redis_url: str, keys: list[str], admin: str, semantic: bool
) -> dict[str, Any]:
    replicas: list[dict[str, Any]] = []
    for i, (base, events) in enumerate(zip(engines.api_bases, engines.events)):
        replicas.append({"name": f"v{i}", "api_base": base, **({"events": events} if events else {})})
    routing: dict[str, Any] = {"engine": "vllm", "probe_interval_s": PROBE_S}
    routing.update(
        {"policy": "cache_aware", "prefix": {"mode": "precise"}}
        if engines.kind == "vllm"
        else {"policy": "round_robin"}
    )
    raw: dict[str, Any] = {
        "cache_dir": str(cache_dir),
        "auth": {"keys": keys, "admin_keys": [admin], "salt_secret_env": SALT_ENV},
        "encryption": {"key_env": MASTER_ENV},
        "routes": [
            {
                "name": "chat",
                "model": "*",
                "scope": "tenant",
                "backend": {"model": f"openai/{MODEL}", "api_key": "none", "timeout": 600},
                "semantic": {"enabled": semantic},
                "replicas": replicas,
                "routing": routing,
            }
        ],
    }
    if store == "redis":
        raw["store"] = {"backend": "redis", "url": redis_url, "follow_interval_s": 0.1}
    return raw


class Proxy:
    """One `kvgate serve` child process."""

    def __init__(self, store: str, work: Path, config: dict[str, Any], env: dict[str, str], admin: str) -> None:
        from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv

        self.store = store
        self.cache_dir = Path(config["cache_dir"])
        path = work / f"proxy-{store}.yaml"
        path.write_text(json.dumps(config, indent=2))  # YAML reads JSON
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (work / "logs").mkdir(parents=True, exist_ok=True)
        self.proc = Proc(
            f"proxy-{store}",
            kvgate_argv("serve", "--config", str(path), "--port", str(self.port), "--log-level", "warning"),
            work / "logs",
            env,
        )
        self.http = httpx.Client(base_url=self.url, timeout=600)
        self._admin = {"authorization": f"Bearer {admin}"}

    def wait(self) -> None:
        self.proc.wait_http(f"{self.url}/health", timeout=180)

    def chat(
        self,
        key: str,
        messages: list[dict[str, str]],
        *,
        tags: list[str] | None = None,
        control: str | None = None,
        max_tokens: int = 32,
    ) -> Reply:
        headers = {"authorization": f"Bearer {key}"}
        if tags:
            headers["x-kvgate-tags"] = ", ".join(tags)
        if control:
            headers["x-kvgate-cache-control"] = control
        body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stop": STOP}
        r = self.http.post("/v1/chat/completions", json=body, headers=headers)
        if r.status_code != 200:
            raise RuntimeError(f"proxy-{self.store}: HTTP {r.status_code}: {r.text[:300]}")
        data = r.json()
        usage = data.get("usage") or {}
        entry = r.headers.get("x-kvgate-entry-id")
        return Reply(
            r.headers.get("x-kvgate-cache", ""),
            int(entry) if entry else None,
            r.headers.get("x-kvgate-replica"),
            int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
            int(usage.get("prompt_tokens") or 0),
            data["choices"][0]["message"].get("content") or "",
        )

    def erase(self, tenant: str) -> dict[str, Any]:
        return self._admin_call("DELETE", f"/v1/admin/tenants/{tenant}")

    def invalidate(self, tags: list[str]) -> dict[str, Any]:
        return self._admin_call("POST", "/v1/admin/invalidate", {"tags": tags})

    def _admin_call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self.http.request(method, path, headers=self._admin, json=body)
        if r.status_code != 200:
            raise RuntimeError(f"proxy-{self.store}: {method} {path}: HTTP {r.status_code}: {r.text[:300]}")
        return r.json()

    def log_count(self, text: str) -> int:
        return self.proc.log_path.read_text(errors="replace").count(text)

    def stop(self) -> None:
        self.http.close()
        self.proc.stop()


class Stack:
    """Redis, two engines and two proxies (module docstring); `close()` stops them all."""

    def __init__(
        self, work: Path, engine: str, progress: Callable[[str], None], *, semantic: bool = True, max_tokens: int = 32
    ) -> None:
        from kvgate.tools.bench.governance_engines import FakeEngines, VllmEngines
        from kvgate.tools.redis_proc import RedisServer

        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.progress = progress
        self.max_tokens = max_tokens
        self.master_hex = os.urandom(32).hex()
        self.salt_secret = secrets.token_hex(32)
        self.token = secrets.token_hex(4)  # names this run's documents, canaries and tags
        self.keys = {t: f"kvgate-bench-{t}-{secrets.token_hex(8)}" for t in TENANTS}
        admin = f"kvgate-bench-admin-{secrets.token_hex(8)}"
        env = {MASTER_ENV: self.master_hex, SALT_ENV: self.salt_secret}
        self.redis: Any = None
        self.engines: Any = None
        self.proxies: dict[str, Proxy] = {}
        try:
            self.redis = RedisServer(maxmemory="2gb").start()  # the policy the docs ask of a KV tier's Redis
            self.engines = (
                VllmEngines(work, self.redis.url, MASTER_ENV, self.master_hex, progress)
                if engine == "vllm"
                else FakeEngines()
            )
            progress(f"governance: starting two proxies (response cache on disk / on Redis), {engine} engines")
            for store in STORES:
                config = proxy_config(
                    store,
                    work / f"cache-{store}",
                    self.engines,
                    self.redis.url,
                    list(self.keys.values()),
                    admin,
                    semantic,
                )
                self.proxies[store] = Proxy(store, work, config, env, admin)
            for proxy in self.proxies.values():
                proxy.wait()
            self._warm_up()
        except BaseException:
            self.close()
            raise

    def _warm_up(self) -> None:
        """A first prefill on each engine (a fresh engine's first one costs a one-off set-up), then
        requests through each proxy, which describe the engines to it before anything is measured."""
        for i, base in enumerate(self.engines.api_bases):
            body = {"model": MODEL, "messages": conversation(document(9000 + i, 200), "Say hi."), "max_tokens": 2}
            r = httpx.post(f"{base}/chat/completions", json=body, timeout=300)
            if r.status_code != 200:
                raise RuntimeError(f"warm-up on {base}: HTTP {r.status_code}: {r.text[:300]}")
        for j, proxy in enumerate(self.proxies.values()):
            for i in range(2):
                proxy.chat(
                    self.keys["warm"],
                    conversation(document(9100 + 10 * j + i, 200), "Say hi."),
                    control="no-store",
                    max_tokens=2,
                )

    def tenant(self, name: str) -> str:
        from kvgate.middleware.sdk.admin_client import tenant_id

        return tenant_id(self.keys[name])

    def records(self, name: str) -> dict[str, Any]:
        """Tenant `name`'s salt record (kvgate.middleware.routing.epochs.TenantSalt) in each proxy's
        store, None where there is none: read from the disk proxy's <cache_dir>/tenants and from
        the Redis, as anyone holding them could."""
        from kvgate.index.storage.redis_link import LinkSettings, RedisLink
        from kvgate.middleware.routing.epochs import tenant_digest
        from kvgate.middleware.routing.epochs_disk import DiskEpochStore
        from kvgate.middleware.routing.epochs_redis import RedisEpochStore
        from kvgate.middleware.store_config import StoreConfig

        digest = tenant_digest(self.tenant(name))
        link = RedisLink(LinkSettings(self.redis.url))
        stores = {
            "disk": DiskEpochStore(self.proxies["disk"].cache_dir / "tenants"),
            "redis": RedisEpochStore(link, StoreConfig().key_prefix),
        }
        try:
            return {store: epochs.records([digest]).get(digest) for store, epochs in stores.items()}
        finally:
            for epochs in stores.values():
                epochs.close()
            link.close()

    def salt(self, name: str, record: Any) -> str:
        """Tenant `name`'s cache_salt under salt record `record`, as a proxy makes it."""
        from kvgate.middleware.routing.salt import Salter

        return Salter(self.salt_secret.encode(), lambda _tenant: record).salt(self.tenant(name)) or ""

    def salt_without_nonce(self, name: str, epoch: int) -> str:
        """The cache_salt a salt scheme of the secret, the tenant and its epoch alone would give."""
        import hashlib
        import hmac

        msg = b"tenant\0" + self.tenant(name).encode() + (b"\0epoch\0%d" % epoch if epoch else b"")
        return hmac.new(self.salt_secret.encode(), msg, hashlib.sha256).hexdigest()[:32]

    def ask(self, store: str, tenant: str, messages: list[dict[str, str]], **kw: Any) -> Reply:
        return self.proxies[store].chat(self.keys[tenant], messages, max_tokens=self.max_tokens, **kw)

    def counters(self, settle_s: float = 3.0) -> dict[str, float] | None:
        """The engines' connector counters once the last requests' stats reached /metrics."""
        if self.engines.counters() is None:
            return None
        time.sleep(settle_s)
        return self.engines.counters()

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.stop()
        if self.engines is not None:
            self.engines.stop()
        if self.redis is not None:
            self.redis.stop()
