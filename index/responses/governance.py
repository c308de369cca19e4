"""Removing answers on an operator's word: one tenant's everything, or every answer with a tag.

- `erase_tenant`: every entry the tenant's requests made (whatever the route's scope: a shared
  route's entry holds the tenant's question too), their vectors (store and every process's FAISS
  copy: deletes go through the change log), and the tightening marks its feedback left; then the
  store scrubs its files (kvgate.index.responses.entries.base.EntryStore.scrub). Entries are found
  through the tenant's index term and then by a scan of every entry, so an index row the store lost
  (Redis evicting a set under `maxmemory`) leaves nothing behind: an erasure costs one pass over the
  store, and happens seldom.
- `invalidate`: every entry filed under any of the tags (kvgate.index.responses.tags), optionally
  only one tenant's; through the index alone (one read per listed id), or with `sweep` by a scan.

Each id is read before it counts, so a listed id that vanished meanwhile is not counted, and a
tenant-restricted call never deletes another tenant's entry. Storage failures raise the store's
`failures` (the caller answers with an error: an operator must know an erasure did not finish).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from kvgate.index.responses.entries.base import Stored
from kvgate.index.responses.semantic import SemanticIndex
from kvgate.index.responses.tags import tenant_term


@dataclass(frozen=True)
class Erased:
    """What an erasure removed from the response store."""

    entries: int
    vectors: int
    marks: int
    scrubbed: bool  # the store's files hold no deleted row any more


def erase_tenant(index: SemanticIndex, tenant: str) -> Erased:
    store = index.entries
    found = {s.entry.id: s for s in _loaded(index, store.tagged(tenant_term(tenant))) if s.entry.tenant == tenant}
    for stored in store.scan():
        if stored.entry.tenant == tenant:
            found.setdefault(stored.entry.id, stored)
    entries = vectors = 0
    for entry_id, stored in found.items():
        if index.delete(entry_id):
            entries += 1
            vectors += stored.vector is not None
    marks = 0
    for scope in store.mark_scopes():
        held = store.marks(scope)
        kept = [m for m in held if m.tenant != tenant]
        if len(kept) != len(held):
            store.rewrite_marks(scope, kept)
            marks += len(held) - len(kept)
    return Erased(entries, vectors, marks, store.scrub())


def invalidate(index: SemanticIndex, tags: Iterable[str], tenant: str | None = None, sweep: bool = False) -> int:
    """Delete the entries filed under any of `tags` (only `tenant`'s when given); how many."""
    wanted = set(tags)
    store = index.entries
    if sweep:
        candidates: Iterable[Stored] = store.scan()
    else:
        candidates = _loaded(index, sorted({i for tag in wanted for i in store.tagged(tag)}))
    removed = 0
    for stored in candidates:
        entry = stored.entry
        if wanted.intersection(entry.tags or ()) and (tenant is None or entry.tenant == tenant):
            removed += index.delete(entry.id)
    return removed


def _loaded(index: SemanticIndex, ids: list[int]) -> list[Stored]:
    return [s for s in index.entries.load_many(ids) if s is not None]
