"""An operator's removals: erase a tenant (`DELETE /v1/admin/tenants/{tenant}`, `Gateway.erase_tenant`)
and invalidate tagged answers (`POST /v1/admin/invalidate`, `Gateway.invalidate`).

Erasing a tenant, in this order:
  1. its salt record is replaced by the next epoch and a fresh nonce (`epochs`,
     kvgate.middleware.routing.epochs): from now on its requests carry another cache_salt, so no
     engine prefix cache or KV tier matches the blocks it cached before (they age out), and the
     old nonce is overwritten, so the old salt, and the keys of the KV chunks sealed under it,
     cannot be derived again by anyone;
  2. its response entries, their vectors and its feedback marks go
     (kvgate.index.responses.governance.erase_tenant), and the store's files are scrubbed;
  3. its request-log records go (feedback on its old request ids then finds nothing);
  4. the salt records' files are scrubbed too (no overwritten nonce left in a disk store's log).
A request of the tenant still in flight may store its answer after step 2 (under the new salt):
erase a tenant once it has stopped sending, or erase it again.

Invalidating: entries filed under any of the tags (kvgate.index.responses.tags) are deleted; with
`tenant` only that tenant's (a tenant key's call). Storage failures raise StoreUnavailable: the
operator must know the work did not finish (it is safe to repeat).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from kvgate.index.responses.governance import erase_tenant, invalidate
from kvgate.index.responses.semantic import SemanticIndex
from kvgate.middleware.cache.request_log import RequestLog
from kvgate.middleware.errors import StoreUnavailable


class SaltEpochs(Protocol):
    """What erasing needs of the salt records (kvgate.middleware.routing.epochs.Epochs)."""

    def bump(self, tenant: str) -> int: ...

    def scrub(self) -> bool: ...


@dataclass(frozen=True)
class TenantErased:
    tenant: str
    entries: int
    vectors: int
    feedback_marks: int
    request_log: int
    salt_epoch: int | None  # None: this pipeline keeps no salt epochs
    scrubbed: bool  # the stores' files hold no deleted row any more (False: retry to make sure)

    def to_json(self) -> dict[str, Any]:
        return {
            "object": "tenant.erased",
            "tenant": self.tenant,
            "erased": {
                "entries": self.entries,
                "vectors": self.vectors,
                "feedback_marks": self.feedback_marks,
                "request_log": self.request_log,
            },
            "salt_epoch": self.salt_epoch,
            "scrubbed": self.scrubbed,
        }


@dataclass(frozen=True)
class Invalidated:
    tags: tuple[str, ...]
    tenant: str | None  # None: every tenant's entries (an admin's call)
    removed: int

    def to_json(self) -> dict[str, Any]:
        return {"object": "cache.invalidated", "tags": list(self.tags), "tenant": self.tenant, "removed": self.removed}


class Governance:
    def __init__(self, index: SemanticIndex, requests: RequestLog, epochs: SaltEpochs | None) -> None:
        self.index = index
        self.requests = requests
        self.epochs = epochs

    def erase_tenant(self, tenant: str) -> TenantErased:
        """Blocking (a pass over the stores): call it from a worker thread."""
        failures = self._failures()
        try:
            epoch = self.epochs.bump(tenant) if self.epochs is not None else None
            erased = erase_tenant(self.index, tenant)
            records = self.requests.erase_tenant(tenant)
            scrubbed = erased.scrubbed and (self.epochs.scrub() if self.epochs is not None else True)
        except failures as exc:
            raise StoreUnavailable(
                f"the erasure of tenant {tenant!r} did not finish ({type(exc).__name__}: {exc}); "
                "it is safe to run again"
            ) from None
        return TenantErased(tenant, erased.entries, erased.vectors, erased.marks, records, epoch, scrubbed)

    def invalidate(self, tags: tuple[str, ...], tenant: str | None = None, sweep: bool = False) -> Invalidated:
        """Blocking: call it from a worker thread."""
        try:
            removed = invalidate(self.index, tags, tenant, sweep)
        except self._failures() as exc:
            raise StoreUnavailable(
                f"the invalidation did not finish ({type(exc).__name__}: {exc}); it is safe to run again"
            ) from None
        return Invalidated(tags, tenant, removed)

    def _failures(self) -> tuple[type[BaseException], ...]:
        # the response store's, the request log's (a disk log raises sqlite/OS errors) and the epochs'
        return (*self.index.entries.failures, *getattr(self.epochs, "failures", ()), OSError)
