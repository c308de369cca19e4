"""The response cache's stores, opened from the `store:` config: local dirs or a shared Redis.

`local` (the default): entries in `<cache_dir>/responses`, request ids in `<cache_dir>/requests`
(diskcache; processes on one machine share them); with `feedback.enabled: false` no request-id log
at all (kvgate.middleware.cache.request_log_null). `redis`: both on one Redis, reached through one
RedisLink (kvgate.index.storage.redis_link: pool, timeouts, circuit with backoff). An unreachable Redis at
start-up stops it with one line naming `store.url` (no credentials), unless `on_error: degrade`:
then the proxy starts and serves misses until Redis answers. With `encryption.key_env` the entry
store encrypts what it keeps (kvgate.index.storage.cipher; docs/encryption.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from kvgate.index.responses.entries.base import EntryStore
from kvgate.index.responses.entries.disk import DiskEntryStore
from kvgate.index.responses.entries.redis import RedisEntryStore
from kvgate.index.responses.observations.base import ObservationStore
from kvgate.index.responses.observations.disk import DiskObservationStore
from kvgate.index.responses.observations.redis import RedisObservationStore
from kvgate.index.storage.cipher import EntryCipher, parse_master_key
from kvgate.index.storage.env import MissingSecret, secret_from_env
from kvgate.index.storage.redis_link import LinkSettings, RedisLink
from kvgate.middleware.cache.request_log import DiskRequestLog, RequestLog
from kvgate.middleware.cache.request_log_null import NullRequestLog
from kvgate.middleware.cache.request_log_redis import RedisRequestLog
from kvgate.middleware.config import Config
from kvgate.middleware.errors import ConfigError

log = logging.getLogger("kvgate.store")
LOCAL_FOLLOW_INTERVAL_S = 1.0  # processes on one cache dir look at each other's writes this often


@dataclass
class Stores:
    """What a Pipeline keeps its answers and request ids in. `entries` is None when the caller
    brings its own SemanticIndex; `link` is None for the local backend."""

    entries: EntryStore | None
    requests: RequestLog
    follow_interval_s: float
    link: RedisLink | None = None

    def close(self) -> None:
        """Close what open_stores opened (a start-up that fails after opening them)."""
        if self.entries is not None:
            self.entries.close()
        self.requests.close()
        if self.link is not None:
            self.link.close()


def open_stores(config: Config, dim: int, with_entries: bool = True) -> Stores:
    """Open the configured backend; ConfigError (naming the store field) when it cannot start."""
    st = config.store
    cipher = entry_cipher(config)
    keep_ids = config.feedback.enabled  # false: no request-id log at all (NullRequestLog)
    if st.backend == "local":
        entries = DiskEntryStore(config.cache_dir / "responses", dim, cipher) if with_entries else None
        requests: RequestLog = (
            DiskRequestLog(
                config.cache_dir / "requests", config.feedback.record_ttl, int(config.feedback.record_max_mb * 2**20)
            )
            if keep_ids
            else NullRequestLog()
        )
        return Stores(entries, requests, LOCAL_FOLLOW_INTERVAL_S)
    link = RedisLink(
        LinkSettings(st.url or "", _password(st.password_env), st.connect_timeout_s, st.timeout_s, st.pool_size)
    )
    try:
        _reach(link, st.on_error)
    except ConfigError:
        link.close()
        raise
    entries = RedisEntryStore(link, dim, st.key_prefix, st.log_max, cipher) if with_entries else None
    requests = RedisRequestLog(link, st.key_prefix, config.feedback.record_ttl) if keep_ids else NullRequestLog()
    return Stores(entries, requests, st.follow_interval_s, link)


def open_observations(config: Config, link: RedisLink | None) -> ObservationStore:
    """Where `semantic.max_error_rate` routes keep their verified outcomes: beside the entries
    (`<cache_dir>/observations` locally, the same Redis as the entries with `store: redis`)."""
    if link is None:
        return DiskObservationStore(config.cache_dir / "observations")
    return RedisObservationStore(link, config.store.key_prefix)


def _password(name: str | None) -> str | None:
    """The Redis password store.password_env names; a missing one is a ConfigError, as every fault
    of the config is to the proxy's start-up."""
    try:
        return secret_from_env(name, "store.password_env")
    except MissingSecret as exc:
        raise ConfigError(str(exc)) from None


def entry_cipher(config: Config) -> EntryCipher | None:
    """The cipher of the master key `encryption.key_env` names (None: not set, nothing encrypted);
    an unset variable or one that holds no usable key is a ConfigError naming both, never the key."""
    try:
        value = secret_from_env(config.encryption.key_env, "encryption.key_env")
        return None if value is None else EntryCipher(parse_master_key(value))
    except MissingSecret as exc:
        raise ConfigError(str(exc)) from None
    except ValueError as exc:
        raise ConfigError(f"encryption.key_env: the environment variable {config.encryption.key_env} {exc}") from None


def preflight(config: Config) -> None:
    """Before a server starts its workers: the ConfigError `open_stores` would raise (a missing
    password or key variable, Redis out of reach with on_error: fail), as one line, not a lifespan traceback."""
    entry_cipher(config)
    st = config.store
    if st.backend != "redis":
        return
    link = RedisLink(LinkSettings(st.url or "", _password(st.password_env), st.connect_timeout_s, st.timeout_s, 1))
    try:
        if st.on_error == "fail":
            _reach(link, st.on_error)
    finally:
        link.close()


def _reach(link: RedisLink, on_error: str) -> None:
    """Ping Redis: out of reach is a ConfigError naming store.url (fail) or a warning (degrade)."""
    try:
        link.ping()
    except redis.exceptions.RedisError as exc:
        reason = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        if on_error == "fail":
            raise ConfigError(
                f"store.url: Redis at {link.where} is out of reach ({reason}); set store.on_error: degrade to start anyway and serve misses"
            ) from None
        log.warning("store.url: Redis at %s is out of reach (%s); serving misses until it answers", link.where, reason)
