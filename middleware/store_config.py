"""`store:` and `encryption:` of the config as pydantic models: where the response cache and the
request-id log live (local dirs or a shared Redis, and how proxies on one Redis share their
routing view), and the encryption at rest of the response cache's entries. Secrets are only
named here (an environment variable), never read from the file: each model refuses a password
or key written in it.

Imports only pydantic: kvgate.middleware.config composes these into Config.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SharedRoutingConfig(_Strict):
    """How proxies on one Redis share their routing view (store.backend: redis; README "Scale out on
    Redis"): each pushes its per-replica load and its routing records, and reads the others', every
    `sync_s` in a background thread (middleware/routing/state_redis.py)."""

    sync_s: float = Field(
        0.1,
        gt=0,
        le=10,
        description="seconds between pushes of this proxy's load and records "
        "and reads of the others' (their load is at most ~2×sync_s old)",
    )
    load_ttl_s: float = Field(
        3.0,
        gt=0,
        le=600,
        description="a proxy that stops pushing (dead) has its load forgotten after this many seconds",
    )
    log_max: int = Field(
        20_000,
        ge=100,
        le=10_000_000,
        description="routing records the Redis stream keeps (what a proxy that starts late learns)",
    )
    log_ttl_s: float = Field(3600.0, gt=0, description="the routing stream expires this long after its last record")

    @model_validator(mode="after")
    def _ttl_covers_sync(self) -> "SharedRoutingConfig":
        if self.load_ttl_s < 2 * self.sync_s:
            raise ValueError(
                "store.routing.load_ttl_s must be at least 2 × store.routing.sync_s, or a live proxy's load would expire between its pushes"
            )
        return self


class StoreConfig(_Strict):
    """Where the response cache and the request-id log live (README "Scale out on Redis")."""

    backend: Literal["local", "redis"] = Field(
        "local", description="local = diskcache dirs under cache_dir (one machine); redis = a shared Redis"
    )
    url: str | None = Field(None, description="redis:// | rediss:// | unix:// URL, without a password")
    password_env: str | None = Field(
        None,
        min_length=1,
        description="NAME of the environment variable holding the Redis password (never the password)",
    )
    key_prefix: str = Field("kvgate:", min_length=1, description="prefix of every key kvgate writes")
    connect_timeout_s: float = Field(0.5, gt=0, le=60, description="seconds to open a connection")
    timeout_s: float = Field(0.25, gt=0, le=60, description="seconds per Redis operation; slower = a miss")
    pool_size: int = Field(32, ge=1, le=1024, description="connections per proxy process")
    on_error: Literal["fail", "degrade"] = Field(
        "fail",
        description="Redis out of reach at start-up: fail = stop with an error; degrade = start and serve misses until it answers",
    )
    follow_interval_s: float = Field(
        0.25,
        gt=0,
        le=60,
        description="seconds between reads of the change log (how soon other proxies' answers are searchable)",
    )
    log_max: int = Field(
        1_000_000,
        ge=1000,
        description="change-log entries Redis keeps (a proxy further behind rebuilds its view from a scan)",
    )
    routing: SharedRoutingConfig = Field(default_factory=SharedRoutingConfig)

    @model_validator(mode="before")
    @classmethod
    def _no_password_here(cls, data: Any) -> Any:
        if isinstance(data, dict) and "password" in data:
            raise ValueError(
                "store.password: a password is never read from the config file; put it in an "
                "environment variable and name that variable in store.password_env"
            )
        return data

    @field_validator("url")
    @classmethod
    def _redis_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        scheme = url.split("://", 1)[0] if "://" in url else ""
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError("must start with redis://, rediss:// or unix://")
        netloc = url.split("://", 1)[1].split("/", 1)[0]
        if "@" in netloc and ":" in netloc.split("@", 1)[0]:
            raise ValueError("holds a password; put it in an environment variable named by store.password_env")
        return url

    @model_validator(mode="after")
    def _redis_needs_url(self) -> "StoreConfig":
        if self.backend == "redis" and self.url is None:
            raise ValueError("store.url is required with backend: redis")
        return self


class EncryptionConfig(_Strict):
    """Encryption at rest of the response cache's entries (docs/encryption.md): off unless key_env is set."""

    key_env: str | None = Field(
        None,
        min_length=1,
        description="NAME of the environment variable holding the master key (hex or base64 of "
        "32+ random bytes, e.g. `openssl rand -hex 32`); entries, vectors and marks "
        "on disk or Redis are then AES-GCM encrypted under keys derived from it",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_key_here(cls, data: Any) -> Any:
        if isinstance(data, dict) and "key" in data:
            raise ValueError(
                "encryption.key: a key is never read from the config file; put it in an environment "
                "variable and name that variable in encryption.key_env"
            )
        return data
