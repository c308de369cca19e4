"""The connector's settings: `kv_connector_extra_config` in vLLM's `--kv-transfer-config`.

Tier names and meanings are kvgate's own (the reference replica's `--kv-*` flags and the YAML's
`store` block): `memory` (this engine process's RAM), `disk` (a directory; engines that name the
same directory share it, also across restarts) and `remote` (a Redis every engine can reach).
Reads try them in that order; writes go to all of them. Example:

    {"tiers": {"memory": {"capacity_mb": 1024},
               "disk": {"path": "/var/cache/kvgate/kv", "capacity_mb": 51200},
               "remote": {"url": "rediss://kv.internal:6380/0", "password_env": "KVGATE_REDIS_PASSWORD",
                          "key_prefix": "kvgate", "timeout_s": 0.5, "ttl_s": 0}},
     "codec": "int8", "entropy": "none", "chunk_blocks": "auto", "min_chunk_mb": 1,
     "min_chunk_tokens": 128, "gate": "on", "background_load_ms": 10, "staging_mb": 2048, "encryption_key_env": "KVGATE_MASTER_KEY"}

`encryption_key_env` names the environment variable of the engine that holds the master key
(never the key itself): chunks on disk and in Redis are then sealed with AES-GCM under a key
derived from it and the request's `cache_salt` (kvgate.index.storage.cipher; docs/encryption.md).

Every error names the field (`kv_connector_extra_config.tiers.disk.path: ...`), and an unknown
field is refused rather than ignored.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

FIELD = "kv_connector_extra_config"
CODECS = ("raw", "int8", "int4")
ENTROPY = ("none", "zstd")


class SettingsError(ValueError):
    """A bad connector setting; the message names the field."""


@dataclass(frozen=True)
class MemorySettings:
    capacity_mb: int


@dataclass(frozen=True)
class DiskSettings:
    path: str
    capacity_mb: int


@dataclass(frozen=True)
class RemoteSettings:
    url: str
    password_env: str | None
    key_prefix: str
    timeout_s: float
    ttl_s: int


@dataclass(frozen=True)
class ConnectorSettings:
    memory: MemorySettings | None
    disk: DiskSettings | None
    remote: RemoteSettings | None
    codec: str
    entropy: str
    chunk_blocks: int | None  # None = auto: the fewest blocks that make min_chunk_mb and min_chunk_tokens
    min_chunk_mb: float
    save_queue: int  # chunks waiting for the background writer before new saves are dropped
    min_chunk_tokens: int = 128
    gate: bool = True  # load only what is estimated faster than prefilling it (gate.py)
    background_load_ms: float = 10.0  # loads estimated slower than this run beside the engine's steps
    staging_mb: int = 2048  # host staging buffers (pinned on CUDA, allocated as used) shared by loads and saves
    encryption_key_env: str | None = None  # NAME of the variable holding the master key; None: no encryption

    @property
    def tier_names(self) -> list[str]:
        return [n for n, t in (("memory", self.memory), ("disk", self.disk), ("remote", self.remote)) if t]


def _take(obj: Mapping[str, Any], where: str, allowed: set[str]) -> None:
    if not isinstance(obj, Mapping):
        raise SettingsError(f"{where}: expected an object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise SettingsError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")


def _int(obj: Mapping[str, Any], name: str, where: str, default: int, low: int) -> int:
    v = obj.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise SettingsError(f"{where}.{name}: expected an integer >= {low}, got {v!r}")
    return v


def _num(obj: Mapping[str, Any], name: str, where: str, default: float, low: float) -> float:
    v = obj.get(name, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= low:
        raise SettingsError(f"{where}.{name}: expected a number > {low}, got {v!r}")
    return float(v)


def _choice(obj: Mapping[str, Any], name: str, where: str, default: str, choices: tuple[str, ...]) -> str:
    v = obj.get(name, default)
    if v not in choices:
        raise SettingsError(f"{where}.{name}: expected one of {list(choices)}, got {v!r}")
    return str(v)


def parse(extra: Mapping[str, Any] | None) -> ConnectorSettings:
    """Validate the extra config. `tiers` must name disk or remote: vLLM runs the scheduler, which
    decides what to load, and the worker, which holds the memory tier, in different processes, so a
    memory-only connector could never load anything."""
    if extra is not None and not isinstance(extra, Mapping):
        raise SettingsError(f"{FIELD}: expected an object, got {type(extra).__name__}")
    extra = dict(extra or {})
    _take(
        extra,
        FIELD,
        {
            "tiers",
            "codec",
            "entropy",
            "chunk_blocks",
            "min_chunk_mb",
            "min_chunk_tokens",
            "save_queue",
            "gate",
            "background_load_ms",
            "staging_mb",
            "encryption_key_env",
            "encryption_key",
        },
    )
    if "encryption_key" in extra:
        raise SettingsError(
            f"{FIELD}.encryption_key: a key is never read from the config; put it in an "
            f"environment variable of the engine and name it in {FIELD}.encryption_key_env"
        )
    key_env = extra.get("encryption_key_env")
    if key_env is not None and (not isinstance(key_env, str) or not key_env):
        raise SettingsError(f"{FIELD}.encryption_key_env: the NAME of an environment variable, got {key_env!r}")
    tiers = extra.get("tiers")
    where = f"{FIELD}.tiers"
    if tiers is None:
        raise SettingsError(f'{where}: required, e.g. {{"disk": {{"path": "/var/cache/kvgate/kv"}}}}')
    _take(tiers, where, {"memory", "disk", "remote"})
    if "disk" not in tiers and "remote" not in tiers:
        raise SettingsError(
            f"{where}: name a disk or a remote tier; memory is only a read cache in front of them "
            "(vLLM's scheduler, which decides what to load, cannot see a worker's RAM)"
        )
    memory = disk = remote = None
    if "memory" in tiers:
        m, w = tiers["memory"] or {}, f"{where}.memory"
        _take(m, w, {"capacity_mb"})
        memory = MemorySettings(_int(m, "capacity_mb", w, 1024, 1))
    if "disk" in tiers:
        d, w = tiers["disk"] or {}, f"{where}.disk"
        _take(d, w, {"path", "capacity_mb"})
        path = d.get("path")
        if not isinstance(path, str) or not path:
            raise SettingsError(f"{w}.path: required, a directory (engines naming the same one share it)")
        disk = DiskSettings(os.path.expanduser(path), _int(d, "capacity_mb", w, 10240, 1))
    if "remote" in tiers:
        r, w = tiers["remote"] or {}, f"{where}.remote"
        _take(r, w, {"url", "password_env", "key_prefix", "timeout_s", "ttl_s", "password"})
        if "password" in r:
            raise SettingsError(
                f"{w}.password: a password is never read from the config; put it in an "
                f"environment variable of the engine and name it in {w}.password_env"
            )
        url = r.get("url")
        if not isinstance(url, str) or url.split("://", 1)[0] not in ("redis", "rediss", "unix"):
            raise SettingsError(f"{w}.url: required, redis://, rediss:// (TLS) or unix://, got {url!r}")
        netloc = url.split("://", 1)[1].split("/", 1)[0]
        if ("@" in netloc and ":" in netloc.split("@", 1)[0]) or "password=" in url.split("?", 1)[-1] and "?" in url:
            raise SettingsError(f"{w}.url: holds a password; name an environment variable in {w}.password_env")
        env = r.get("password_env")
        if env is not None and (not isinstance(env, str) or not env):
            raise SettingsError(f"{w}.password_env: the NAME of an environment variable, got {env!r}")
        prefix = r.get("key_prefix", "kvgate")
        if not isinstance(prefix, str) or not prefix or any(c.isspace() for c in prefix):
            raise SettingsError(f"{w}.key_prefix: a non-empty word, got {prefix!r}")
        remote = RemoteSettings(url, env, prefix, _num(r, "timeout_s", w, 0.5, 0), _int(r, "ttl_s", w, 0, 0))
    blocks = extra.get("chunk_blocks", "auto")
    if blocks != "auto" and (isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1):
        raise SettingsError(f'{FIELD}.chunk_blocks: "auto" or an integer >= 1, got {blocks!r}')
    return ConnectorSettings(
        memory,
        disk,
        remote,
        codec=_choice(extra, "codec", FIELD, "int8", CODECS),
        entropy=_choice(extra, "entropy", FIELD, "none", ENTROPY),
        chunk_blocks=None if blocks == "auto" else blocks,
        min_chunk_mb=_num(extra, "min_chunk_mb", FIELD, 1.0, 0),
        min_chunk_tokens=_int(extra, "min_chunk_tokens", FIELD, 128, 1),
        save_queue=_int(extra, "save_queue", FIELD, 64, 1),
        gate=_choice(extra, "gate", FIELD, "on", ("on", "off")) == "on",
        background_load_ms=0.0
        if extra.get("background_load_ms") is not False and extra.get("background_load_ms") == 0
        else _num(extra, "background_load_ms", FIELD, 10.0, 0),
        staging_mb=_int(extra, "staging_mb", FIELD, 2048, 1),
        encryption_key_env=key_env,
    )


def chunk_blocks(settings: ConnectorSettings, block_bytes: int, block_tokens: int | None = None) -> int:
    """Blocks per chunk: the setting, or the fewest whole blocks whose raw KV reaches min_chunk_mb
    and that hold at least min_chunk_tokens tokens (when `block_tokens` is known). Every chunk
    costs a fixed amount of Python, a file and a round trip on each path, so small chunks cap
    the bandwidth; bigger chunks match more coarsely (a prefix is used up to a chunk boundary).
    With the CPU build's 128-token blocks both minimums give one block; with a GPU's 16-token
    blocks, eight. Invariant: >= 1."""
    if settings.chunk_blocks:
        return settings.chunk_blocks
    want = settings.min_chunk_mb * (1 << 20)
    by_bytes = -(-int(want) // max(1, block_bytes))
    by_tokens = -(-settings.min_chunk_tokens // block_tokens) if block_tokens else 1
    return max(1, by_bytes, by_tokens)


def build_tiers(settings: ConnectorSettings, *, with_memory: bool = True) -> list[Any]:
    """The storage tiers, fastest first (the memory tier only `with_memory`: the worker's). A remote
    tier whose password variable is unset or empty is MissingSecret (kvgate.index.storage.env),
    naming the field and the variable; an unreachable Redis is not an error (it costs misses until
    it answers)."""
    from kvgate.index.kv.chunks import DiskTier, MemoryTier
    from kvgate.index.storage.env import secret_from_env

    password = secret_from_env(
        settings.remote.password_env if settings.remote else None, f"{FIELD}.tiers.remote.password_env"
    )
    tiers: list[Any] = []
    if settings.memory and with_memory:
        tiers.append(MemoryTier(settings.memory.capacity_mb << 20))
    if settings.disk:
        tiers.append(DiskTier(settings.disk.path, settings.disk.capacity_mb << 20))
    if settings.remote:
        from kvgate.index.kv.chunks.redis import RedisTier

        r = settings.remote
        tiers.append(
            RedisTier(r.url, prefix=r.key_prefix, password=password, timeout_s=r.timeout_s, ttl_s=r.ttl_s or None)
        )
    return tiers


def build_cipher(settings: ConnectorSettings) -> Any:
    """The ChunkCipher of the master key `encryption_key_env` names, or None when no variable is
    named. An unset or empty variable is MissingSecret (kvgate.index.storage.env), one that holds
    no usable key a SettingsError; both name the field and the variable, never the key."""
    from kvgate.index.storage.cipher import ChunkCipher, parse_master_key
    from kvgate.index.storage.env import secret_from_env

    where = f"{FIELD}.encryption_key_env"
    value = secret_from_env(settings.encryption_key_env, where)
    if value is None:
        return None
    try:
        return ChunkCipher(parse_master_key(value))
    except ValueError as exc:
        raise SettingsError(f"{where}: the environment variable {settings.encryption_key_env} {exc}") from None
