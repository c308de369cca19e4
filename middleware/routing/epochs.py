"""Salt epochs: a per-tenant counter folded into the tenant's cache_salt (kvgate.middleware.routing.salt),
bumped when the tenant is erased.

A new epoch gives the tenant a new salt, so no engine prefix cache, no KV tier and no block hash
of kvgate's own matches what its requests cached before: those blocks are unreachable and age out,
and KV chunks sealed under keys derived from the old salt can no longer be opened. The counters
live in the store the proxies share (a diskcache dir beside the response cache, or the same
Redis), so every proxy on it salts a tenant alike; a tenant is named there by a digest only.

`EpochStore` is the protocol, one file per backend (epochs_disk.py, epochs_redis.py). `Epochs` is
what a request asks: a copy in memory, read again from the store when its generation counter
(bumped with every epoch) moved, at most every `interval_s`, so a request costs no round trip and
another proxy's erasure is seen within `interval_s`. A store out of reach keeps the last copy
(counted, logged once per streak); a bump through an unreachable store raises.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Protocol

from kvgate.index.storage.softfail import SoftFailures

log = logging.getLogger("kvgate.salt")


def tenant_digest(tenant: str) -> str:
    """How a store names a tenant: no tenant name (an SDK namespace may be anything) in a key."""
    return hashlib.sha256(b"kvgate salt epoch\0" + tenant.encode()).hexdigest()[:32]


class EpochStore(Protocol):
    failures: tuple[type[BaseException], ...]  # what storage trouble raises
    where: str

    def generation(self) -> int:
        """A counter that moves with every bump (0 before the first)."""
        ...

    def epochs(self) -> dict[str, int]:
        """Every tenant digest whose epoch is above 0, with its epoch."""
        ...

    def bump(self, digest: str) -> int:
        """Raise the tenant's epoch by one (atomic across processes); the new epoch."""
        ...

    def close(self) -> None:
        ...


class Epochs:
    """The epochs a proxy salts with (thread-safe)."""

    def __init__(self, store: EpochStore, interval_s: float = 1.0) -> None:
        self.store = store
        self.failures = store.failures  # what a bump raises when the store fails
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._known: dict[str, int] = {}
        self._generation: int | None = None
        self._checked = float("-inf")
        self._soft = SoftFailures(log, f"salt epochs {store.where}")

    def epoch(self, tenant: str) -> int:
        """The tenant's current epoch (0: never erased)."""
        if time.monotonic() - self._checked >= self.interval_s:
            self._refresh()
        return self._known.get(tenant_digest(tenant), 0)

    def bump(self, tenant: str) -> int:
        """Give the tenant a new epoch, in the store and at once here."""
        digest = tenant_digest(tenant)
        epoch = self.store.bump(digest)
        with self._lock:
            self._known = {**self._known, digest: max(epoch, self._known.get(digest, 0))}
        return epoch

    def _refresh(self) -> None:
        with self._lock:
            if time.monotonic() - self._checked < self.interval_s:  # another thread just did
                return
            self._checked = time.monotonic()
            try:
                generation = self.store.generation()
                if generation != self._generation:
                    self._known, self._generation = self.store.epochs(), generation
            except self.store.failures as exc:  # the last copy stands; the next look tries again
                self._soft.failed("read", exc)
                return
            self._soft.succeeded("read")

    def close(self) -> None:
        self.store.close()
