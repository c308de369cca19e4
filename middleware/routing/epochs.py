"""Salt records: per tenant, an epoch and a random nonce, both folded into the tenant's cache_salt
(kvgate.middleware.routing.salt) and both replaced when the tenant is erased.

Why a nonce: the salt is an HMAC under the proxies' salt secret, and a salt made of the tenant and
a counter alone can be computed again, for any past epoch, by whoever holds that secret; with the
master key it would then open the chunks an erasure leaves in the KV tiers. The nonce (32 random
bytes) exists only in the store below and in the memory of the proxies that use it. An erasure
overwrites it with a fresh one, so the old salt can never be computed again and the chunks sealed
under keys derived from it are crypto-erased. The epoch only counts erasures (what one reports).

A tenant's record is made on its first salted request, create-if-absent in the store so that the
proxies sharing it agree, then kept in memory: once its record is known, a request costs no round
trip. The store is the one the proxies share (a diskcache dir beside the response cache, or the
same Redis); it names a tenant by a digest only. `EpochStore` is the protocol, one file per backend
(epochs_disk.py, epochs_redis.py).

`Epochs` is what a request asks. The records it knows are read again when the store's generation
counter (bumped with every erasure) moved, at most every `interval_s`, so another proxy's erasure
is seen within `interval_s`. Store trouble never fails a request, and never makes two tenants share
a salt: a store out of reach keeps the last copy (counted, logged once per streak), and a tenant
first seen while it is out of reach gets a nonce of this process only, offered to the store again
at every look until it answers (the store's record, if another proxy made one meanwhile, wins).
Until then only the tenant's reuse of its prefixes across proxies is lost. An erasure through an
unreachable store raises.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from typing import NamedTuple, Protocol

from kvgate.index.storage.softfail import SoftFailures

log = logging.getLogger("kvgate.salt")
NONCE_BYTES = 32


def tenant_digest(tenant: str) -> str:
    """How a store names a tenant: no tenant name (an SDK namespace may be anything) in a key."""
    return hashlib.sha256(b"kvgate salt epoch\0" + tenant.encode()).hexdigest()[:32]


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


class TenantSalt(NamedTuple):
    """A tenant's salt record, as the stores keep it: "<epoch>:<nonce as hex>"."""

    epoch: int
    nonce: bytes

    def encode(self) -> str:
        return f"{self.epoch}:{self.nonce.hex()}"

    @staticmethod
    def decode(raw: object) -> TenantSalt | None:
        """The record a store holds; None for none, or for a value that is not one."""
        if isinstance(raw, bytes):
            raw = raw.decode(errors="replace")
        if not isinstance(raw, str):
            return None
        epoch, _, nonce = raw.partition(":")
        try:
            record = TenantSalt(int(epoch), bytes.fromhex(nonce))
        except ValueError:
            return None
        return record if len(record.nonce) == NONCE_BYTES and record.epoch >= 0 else None


class EpochStore(Protocol):
    failures: tuple[type[BaseException], ...]  # what storage trouble raises
    where: str

    def generation(self) -> int:
        """A counter that moves with every erasure (0 before the first)."""
        ...

    def records(self, digests: list[str]) -> dict[str, TenantSalt]:
        """The records the store holds of these tenant digests (the others left out)."""
        ...

    def get_or_create(self, digest: str, nonce: bytes) -> TenantSalt:
        """The tenant's record, made with `nonce` if it has none (atomic across processes: every
        caller gets the record that won)."""
        ...

    def bump(self, digest: str, nonce: bytes) -> TenantSalt:
        """Overwrite the tenant's record with the next epoch and `nonce`, and move the generation
        (atomic across processes); the new record."""
        ...

    def scrub(self) -> bool:
        """Leave no overwritten record in the store's files; False when that could not be made sure."""
        ...

    def close(self) -> None: ...


class Epochs:
    """The salt records a proxy salts with (thread-safe)."""

    def __init__(self, store: EpochStore, interval_s: float = 1.0) -> None:
        self.store = store
        self.failures = store.failures  # what a bump raises when the store fails
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._known: dict[str, TenantSalt] = {}  # written under the lock; read without it
        self._local: set[str] = set()  # digests whose record the store has not taken yet
        self._generation: int | None = None
        self._checked = float("-inf")
        self._reachable = True  # the last call to the store worked: a new tenant may ask it
        self._soft = SoftFailures(log, f"salt epochs {store.where}")

    def record(self, tenant: str) -> TenantSalt:
        """The tenant's current record (made on its first use)."""
        if time.monotonic() - self._checked >= self.interval_s:
            self._refresh()
        digest = tenant_digest(tenant)
        known = self._known.get(digest)
        return known if known is not None else self._first(digest)

    def bump(self, tenant: str) -> int:
        """Give the tenant a new epoch and nonce, in the store and at once here; the new epoch."""
        digest = tenant_digest(tenant)
        record = self.store.bump(digest, new_nonce())
        with self._lock:
            self._adopt(digest, record)
        return record.epoch

    def scrub(self) -> bool:
        return self.store.scrub()

    def _first(self, digest: str) -> TenantSalt:
        record = None
        if self._reachable:
            try:
                record = self.store.get_or_create(digest, new_nonce())
            except self.failures as exc:
                self._soft.failed("nonce write", exc)
                self._reachable = False
            else:
                self._soft.succeeded("nonce write")
        with self._lock:
            if record is not None:
                self._adopt(digest, record)
            elif digest not in self._known:  # a random salt of its own: never another tenant's
                self._known[digest] = TenantSalt(0, new_nonce())
                self._local.add(digest)
            return self._known[digest]

    def _adopt(self, digest: str, record: TenantSalt) -> None:
        """Under the lock: a record of the store replaces one made here, and one of an earlier
        epoch (a bump here may have overtaken a read of the store)."""
        known = self._known.get(digest)
        if known is None or digest in self._local or record.epoch >= known.epoch:
            self._known[digest] = record
            self._local.discard(digest)

    def _refresh(self) -> None:
        with self._lock:
            if time.monotonic() - self._checked < self.interval_s:  # another thread just did
                return
            self._checked = time.monotonic()
            try:
                generation = self.store.generation()
                if generation != self._generation:
                    fresh = self.store.records(list(self._known))
                    for digest in [d for d in self._known if d not in fresh and d not in self._local]:
                        del self._known[digest]  # the store lost it (emptied): made again on next use
                    for digest, record in fresh.items():
                        self._adopt(digest, record)
                    self._generation = generation
                for digest in list(self._local):
                    self._adopt(digest, self.store.get_or_create(digest, self._known[digest].nonce))
            except self.failures as exc:  # the last copy stands; the next look tries again
                self._soft.failed("read", exc)
                self._reachable = False
                return
            self._reachable = True
            self._soft.succeeded("read")

    def close(self) -> None:
        self.store.close()
