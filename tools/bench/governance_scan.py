"""What `kvgate bench governance` finds of a tenant in the stores, read the way someone holding the
disk or the Redis would, and the way the stores' own readers would.

- Raw scans: every byte of every file under a directory (SQLite pages, write-ahead logs, value
  files, chunk files) and every key and value of every type in Redis, searched for the tenant's
  canary strings as they are (plaintext). Per layer: the disk response store, the Redis response
  store (its keys, and the Redis proxy's own cache_dir), the KV connector's disk tier and Redis
  tier, and the processes' logs.
- KV chunks: the keys each tier holds, and how many of a given set of keys open under any of a
  given list of cache_salts: each chunk read as the tier stores it and opened by the connector's
  cipher with the master key (ChunkCipher, what the connector's reader runs). Nothing is dropped
  or promoted, so every salt can be tried on every chunk, in any order.
- Response entries: the entries each response store holds per tenant, read through the store with
  the master key (what a proxy could still serve or a holder of the key could still read).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Iterator

from kvgate.tools.bench.governance_engines import KV_DISK_MB, KV_PREFIX

EMBED_DIM = 384  # the packaged MiniLM's; a vector of another length only reads as absent


def count_in_files(directory: Path | None, needles: list[bytes]) -> int | None:
    """Occurrences of any needle in the raw bytes of every file under `directory` (None: no such layer)."""
    if directory is None:
        return None
    found = 0
    for f in sorted(directory.rglob("*")) if directory.exists() else ():
        if f.is_file() and not f.is_symlink():
            try:
                data = f.read_bytes()
            except OSError:  # removed while read (a WAL checkpoint)
                continue
            found += sum(data.count(n) for n in needles)
    return found


def redis_items(url: str) -> Iterator[tuple[bytes, list[bytes]]]:
    """Every key with everything it holds, as Redis returns them (every type)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(count=1000):
            kind = client.type(key)
            if kind == b"string":
                values = [client.get(key) or b""]
            elif kind == b"hash":
                values = [x for pair in client.hgetall(key).items() for x in pair]
            elif kind == b"set":
                values = list(client.smembers(key))
            elif kind == b"zset":
                values = list(client.zrange(key, 0, -1))
            elif kind == b"list":
                values = list(client.lrange(key, 0, -1))
            elif kind == b"stream":
                values = [repr(row).encode() for row in client.xrange(key)]
            else:
                values = []
            yield key, values
    finally:
        client.close()


def scan_layers(stack: Any, needles: list[bytes]) -> dict[str, int | None]:
    """Occurrences of the needles per layer (module docstring)."""
    kv_redis = response_redis = 0
    for key, values in redis_items(stack.redis.url):
        hits = sum(blob.count(n) for blob in (key, *values) for n in needles)
        if key.startswith(f"{KV_PREFIX}:".encode()):
            kv_redis += hits
        else:
            response_redis += hits
    redis_dir = count_in_files(stack.proxies["redis"].cache_dir, needles) or 0
    engines = stack.engines
    return {
        "response_disk": count_in_files(stack.proxies["disk"].cache_dir, needles),
        "response_redis": response_redis + redis_dir,
        "kv_disk": count_in_files(engines.kv_disk, needles),
        "kv_redis": kv_redis if engines.kv_redis else None,
        "logs": count_in_files(stack.work / "logs", needles),
    }


def _tiers(engines: Any) -> dict[str, Any]:
    """A fresh reader of each KV tier the engines write (none for fake engines)."""
    from kvgate.index.kv.chunks import DiskTier
    from kvgate.index.kv.chunks.redis import RedisTier

    tiers: dict[str, Any] = {}
    if engines.kv_disk is not None:
        tiers["kv_disk"] = DiskTier(engines.kv_disk, KV_DISK_MB << 20)
    if engines.kv_redis is not None:
        tiers["kv_redis"] = RedisTier(engines.kv_redis, prefix=KV_PREFIX)
    return tiers


def chunk_keys(engines: Any) -> dict[str, set[str]]:
    """The chunk keys each KV tier holds now."""
    out = {}
    for name, tier in _tiers(engines).items():
        out[name] = set(tier.keys())
        tier.close()
    return out


def openable_chunks(engines: Any, master_hex: str, keys: dict[str, set[str]], salts: list[str]) -> dict[str, int]:
    """Per tier, how many of `keys` open under any of `salts` (module docstring)."""
    from kvgate.index.kv.chunks.codec import CorruptChunk
    from kvgate.index.storage.cipher import AuthFailed, ChunkCipher

    cipher = ChunkCipher(bytes.fromhex(master_hex))

    def opens(data: bytes, key: str, salt: str) -> bool:
        try:
            cipher.open(data, key, salt)  # bytes: opened into a new buffer, `data` stays as stored
        except AuthFailed:
            return False
        return True

    out: dict[str, int] = {}
    for name, tier in _tiers(engines).items():
        try:
            found = 0
            for key in sorted(keys.get(name, set())):
                try:
                    stored = tier.get(key)
                except CorruptChunk:  # its file went with an eviction meanwhile
                    stored = None
                if stored is not None:
                    found += any(opens(bytes(stored), key, salt) for salt in salts)
            out[name] = found
        finally:
            tier.close()
    return out


def _entry_stores(stack: Any) -> Iterable[tuple[str, Any]]:
    from kvgate.index.responses.entries.disk import DiskEntryStore
    from kvgate.index.responses.entries.redis import RedisEntryStore
    from kvgate.index.storage.cipher import EntryCipher
    from kvgate.index.storage.redis_link import LinkSettings, RedisLink

    master = bytes.fromhex(stack.master_hex)
    yield "response_disk", DiskEntryStore(stack.proxies["disk"].cache_dir / "responses", EMBED_DIM, EntryCipher(master))
    yield (
        "response_redis",
        RedisEntryStore(RedisLink(LinkSettings(stack.redis.url)), EMBED_DIM, cipher=EntryCipher(master)),
    )


def entries_by_tenant(stack: Any) -> dict[str, dict[str, int]]:
    """Per response store: tenant id → entries it holds, read with the master key."""
    out: dict[str, dict[str, int]] = {}
    for name, store in _entry_stores(stack):
        try:
            out[name] = dict(Counter(s.entry.tenant or "" for s in store.scan()))
        finally:
            store.close()
    return out
