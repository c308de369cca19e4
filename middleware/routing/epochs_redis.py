"""RedisEpochStore: the tenants' salt records (kvgate.middleware.routing.epochs) on the shared Redis
of `store: redis`, so every proxy of a fleet salts a tenant alike. Keys under the store's prefix P:
`P salt-tenants` (hash: tenant digest → "<epoch>:<nonce hex>") and `P salt-gen` (the generation
counter), each change one script (atomic); `P salt-epochs` is the erasure counter of a version
without nonces, read to number a tenant's first record. Nothing expires: an erased tenant's record
must outlive every block cached under its old salt. An erasure overwrites the field in place;
Redis's persistence files (RDB snapshots, the AOF) may still hold the old value until rewritten."""

from __future__ import annotations

import redis

from kvgate.index.storage.redis_link import RedisLink
from kvgate.middleware.routing.epochs import TenantSalt

# KEYS: records, old counters; ARGV: digest, nonce hex → the record that won
_CREATE = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and string.match(cur, '^%d+:%x+$') then return cur end
local rec = (tonumber(redis.call('HGET', KEYS[2], ARGV[1])) or 0) .. ':' .. ARGV[2]
redis.call('HSET', KEYS[1], ARGV[1], rec)
return rec
"""
# KEYS: records, old counters, generation; ARGV: digest, nonce hex → the new record
_BUMP = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local epoch = cur and tonumber(string.match(cur, '^(%d+):') or '')
if not epoch then epoch = tonumber(redis.call('HGET', KEYS[2], ARGV[1])) or 0 end
local rec = string.format('%d:%s', epoch + 1, ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], rec)
redis.call('INCR', KEYS[3])
return rec
"""


class RedisEpochStore:
    def __init__(self, link: RedisLink, key_prefix: str) -> None:
        self.link = link
        self.where = link.where
        self.failures: tuple[type[BaseException], ...] = (redis.exceptions.RedisError,)
        self._records, self._old, self._gen = (
            f"{key_prefix}salt-tenants",
            f"{key_prefix}salt-epochs",
            f"{key_prefix}salt-gen",
        )
        self._create, self._bump = link.client.register_script(_CREATE), link.client.register_script(_BUMP)

    def generation(self) -> int:
        return int(self.link.run("lookup", lambda r: r.get(self._gen)) or 0)

    def records(self, digests: list[str]) -> dict[str, TenantSalt]:
        if not digests:
            return {}
        raw = self.link.run("lookup", lambda r: r.hmget(self._records, digests))
        found = {d: TenantSalt.decode(value) for d, value in zip(digests, raw)}
        return {d: record for d, record in found.items() if record is not None}

    def get_or_create(self, digest: str, nonce: bytes) -> TenantSalt:
        raw = self.link.run(
            "store", lambda r: self._create(keys=[self._records, self._old], args=[digest, nonce.hex()])
        )
        return self._decoded(raw)

    def bump(self, digest: str, nonce: bytes) -> TenantSalt:
        raw = self.link.run(
            "store", lambda r: self._bump(keys=[self._records, self._old, self._gen], args=[digest, nonce.hex()])
        )
        return self._decoded(raw)

    def scrub(self) -> bool:
        """Redis keeps no freed value readable through its API; its persistence files are its own."""
        return True

    def _decoded(self, raw: object) -> TenantSalt:
        record = TenantSalt.decode(raw)
        if record is None:
            raise redis.exceptions.DataError(f"{self._records}: a tenant's record is not one ({raw!r:.40})")
        return record

    def close(self) -> None:
        """The link is the response store's: it closes it."""
