"""The EntryStore contract (kvgate.index.responses.entries.base), checked against every implementation.

A backend joins by adding one opener to STORES: `opener(tmp_path, dim)` returns a function that
opens a new handle on one shared store, so two handles stand for two processes. The Redis store runs
them against a real redis-server (kvgate.tools.redis_proc) and passes every test here unchanged; the
tests at the end forge damage through one backend's internals and are that backend's own.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from kvgate.index.responses.entries import CacheEntry, DiskEntryStore, EntryStore, LogGap, Stored
from kvgate.index.responses.entries.redis import RedisEntryStore
from kvgate.index.responses.tags import tenant_term
from kvgate.index.responses.tighten import Mark
from kvgate.index.storage.cipher import EntryCipher
from kvgate.index.storage.redis_link import LinkSettings, RedisLink
from kvgate.tools.redis_proc import RedisServer

DIM = 8
Opener = Callable[[], EntryStore]


MASTER_KEY = bytes(range(32))  # the encrypted variants: every handle of a store shares the master key


def disk_store(tmp_path: Path, dim: int, cipher: EntryCipher | None = None) -> Opener:
    return lambda: DiskEntryStore(tmp_path / "entries", dim, cipher)


def redis_store(tmp_path: Path, dim: int, url: str, cipher: EntryCipher | None = None) -> Opener:
    prefix = f"t{tmp_path.name}:"  # one store per test, even on a shared server
    return lambda: RedisEntryStore(RedisLink(LinkSettings(url)), dim, key_prefix=prefix, cipher=cipher)


STORES = [
    pytest.param("disk", id="disk"),
    pytest.param("redis", id="redis"),
    pytest.param("disk-encrypted", id="disk-encrypted"),
    pytest.param("redis-encrypted", id="redis-encrypted"),
]


@pytest.fixture(scope="module")
def shared_redis() -> Iterator[RedisServer]:
    """One real redis-server for this module's contract tests (each test its own key prefix)."""
    with RedisServer() as server:
        yield server


@pytest.fixture(params=STORES)
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    handles: list[EntryStore] = []
    cipher = EntryCipher(MASTER_KEY) if request.param.endswith("-encrypted") else None
    if request.param.startswith("disk"):
        opener = disk_store(tmp_path, DIM, cipher)
    else:
        opener = redis_store(tmp_path, DIM, request.getfixturevalue("shared_redis").url, cipher)

    def open_handle() -> EntryStore:
        handles.append(opener())
        return handles[-1]

    yield open_handle
    for handle in handles:
        handle.close()


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def new_entry(store: EntryStore, key: str | None = None, text: str = "q", ttl: float | None = None) -> CacheEntry:
    (entry_id,) = store.allocate(1)
    now = time.time()
    return CacheEntry(
        entry_id,
        "scope",
        {"choices": [{"message": {"content": f"answer {entry_id}"}}]},
        key,
        text,
        "route",
        "model",
        now,
        now + ttl if ttl else None,
    )


def test_protocol_shape(open_store: Opener) -> None:
    store = open_store()
    assert isinstance(store, EntryStore)
    assert store.dim == DIM and isinstance(store.where, str) and store.damaged == 0
    assert store.failures and all(issubclass(f, BaseException) for f in store.failures)
    assert store.volume() >= 0


def test_ids_are_unique_across_handles(open_store: Opener) -> None:
    a, b = open_store(), open_store()
    ids = a.allocate(3) + b.allocate(2) + a.allocate(1)
    assert len(set(ids)) == 6


def test_put_then_read_from_another_handle(open_store: Opener) -> None:
    a, b = open_store(), open_store()
    entry = new_entry(a, key="k1", text="what is x?")
    size = a.put(entry, unit(1))
    assert b.get(entry.id) == entry and b.get_exact("k1") == entry and b.exact_id("k1") == entry.id
    stored = b.load(entry.id)
    assert isinstance(stored, Stored) and stored.entry == entry and stored.size == size > 0
    assert stored.vector is not None and np.allclose(stored.vector, unit(1))
    copy = b.vector(entry.id)
    assert copy is not None and np.allclose(copy, unit(1))
    copy[:] = 0  # a copy: the store is unchanged
    assert np.allclose(b.vector(entry.id), unit(1))  # type: ignore[arg-type]

    exact_only = new_entry(a, key="k2")
    small = a.put(exact_only)
    assert b.vector(exact_only.id) is None and b.load(exact_only.id).vector is None  # type: ignore[union-attr]
    assert 0 < small and b.load(exact_only.id).size == small  # type: ignore[union-attr]
    assert b.get(max(entry.id, exact_only.id) + 100) is None and b.get_exact("never") is None


def test_a_newer_entry_takes_the_pointer_and_keeps_it(open_store: Opener) -> None:
    a, b = open_store(), open_store()
    old, new = new_entry(a, key="k"), new_entry(b, key="k")
    a.put(old, unit(1))
    b.put(new, unit(2))
    assert a.get_exact("k") == new and a.exact_id("k") == new.id
    assert a.get(old.id) == old  # the earlier entry stays until deleted
    assert a.delete(old.id)  # must not take the newer entry's pointer with it
    assert b.get_exact("k") == new
    assert b.delete(new.id)
    assert a.get_exact("k") is None and a.exact_id("k") is None


def test_a_deleted_entry_is_a_miss_everywhere(open_store: Opener) -> None:
    a, b = open_store(), open_store()
    entry = new_entry(a, key="k")
    a.put(entry, unit(3))
    assert b.delete(entry.id)
    for store in (a, b):
        assert store.get(entry.id) is None and store.load(entry.id) is None and store.vector(entry.id) is None
        assert store.get_exact("k") is None and entry.id not in {s.entry.id for s in store.scan()}
    assert not a.delete(entry.id)  # twice is harmless
    assert not a.rewrite(entry)  # and never resurrected


def test_expired_entries_vanish(open_store: Opener) -> None:
    a, b = open_store(), open_store()
    short, lasting = new_entry(a, key="short", ttl=0.4), new_entry(a, key="lasting")
    a.put(short, unit(4), ttl=0.4)
    a.put(lasting, unit(5))
    a.set_marks("scope", [Mark(unit(6), 0.9, 1.0)], ttl=0.4)
    assert b.get_exact("short") == short and len(b.marks("scope")) == 1
    time.sleep(0.6)
    assert b.get(short.id) is None and b.get_exact("short") is None and b.vector(short.id) is None
    assert b.load(short.id) is None and not b.rewrite(short)
    assert {s.entry.id for s in b.scan()} == {lasting.id} and b.marks("scope") == []


def test_rewrite_keeps_vector_pointer_and_expiry(open_store: Opener) -> None:
    a, b = open_store(), open_store()
    entry = new_entry(a, key="k", ttl=0.5)
    a.put(entry, unit(7), ttl=0.5)
    entry.min_similarity = 0.93
    assert a.rewrite(entry)
    assert b.get_exact("k").min_similarity == 0.93  # type: ignore[union-attr]
    assert np.allclose(b.vector(entry.id), unit(7))  # type: ignore[arg-type]
    time.sleep(0.7)
    assert b.get(entry.id) is None  # the rewrite did not extend its life


def test_put_many_and_scan(open_store: Opener) -> None:
    a, b = open_store(), open_store()
    single = new_entry(a, key="one")
    a.put(single)
    ids = a.allocate(5)
    rows = [CacheEntry(i, "bulk", {"n": i}, None, f"t{i}") for i in ids]
    sizes = a.put_many([(row, unit(i)) for row, i in zip(rows, ids)])
    scanned = {s.entry.id: s for s in b.scan()}
    assert set(scanned) == {single.id, *ids}
    for row, size in zip(rows, sizes):
        assert scanned[row.id].entry == row and scanned[row.id].size == size
        assert np.allclose(scanned[row.id].vector, unit(row.id))  # type: ignore[arg-type]
    assert scanned[single.id].vector is None


def test_marks_are_shared_and_replaced(open_store: Opener) -> None:
    a, b = open_store(), open_store()
    assert a.marks("s") == []
    a.set_marks("s", [Mark(unit(1), 0.91, 1.0), Mark(unit(2), 0.92, 2.0)])
    got = b.marks("s")
    assert [m.similarity for m in got] == [0.91, 0.92] and np.allclose(got[1].center, unit(2))
    b.set_marks("s", [Mark(unit(3), 0.95, 3.0)])  # last writer wins
    assert [m.similarity for m in a.marks("s")] == [0.95] and a.marks("other") == []


def test_entries_are_filed_under_their_tags_and_tenant(open_store: Opener) -> None:
    a, b = open_store(), open_store()
    doc, other, plain = new_entry(a, key="k1"), new_entry(a, key="k2", ttl=0.3), new_entry(a, key="k3")
    doc.tenant, doc.tags = "acme", ["doc:1@v2", "model:m1"]
    other.tenant, other.tags = "umbrella", ["doc:1@v2"]
    a.put(doc, unit(1))
    a.put(other, unit(2), ttl=0.3)
    a.put(plain)
    assert b.tagged("doc:1@v2") == sorted([doc.id, other.id]) and b.tagged("model:m1") == [doc.id]
    assert b.tagged(tenant_term("acme")) == [doc.id] and b.tagged("doc:1") == [] and b.tagged("doc:1@v") == []
    assert b.get(doc.id).tags == ["doc:1@v2", "model:m1"] and b.get(doc.id).tenant == "acme"
    assert b.delete(doc.id)
    assert a.tagged("model:m1") == [] and a.tagged(tenant_term("acme")) == []
    time.sleep(0.4)  # expired: may still be listed (a listed id may have vanished), never read
    assert a.get(other.id) is None and all(a.get(i) is None for i in a.tagged("doc:1@v2"))
    fresh = new_entry(a, key="k4")
    fresh.tags = ["doc:1@v2"]
    a.put(fresh)  # and a busy term's listing holds its live entries only
    assert b.tagged("doc:1@v2") == [fresh.id]
    assert a.scrub()


def test_marks_rewritten_keep_their_expiry_and_tenant(open_store: Opener) -> None:
    a, b = open_store(), open_store()
    a.set_marks("s1", [Mark(unit(1), 0.91, 1.0, "acme"), Mark(unit(2), 0.92, 2.0, "umbrella")], ttl=0.5)
    a.set_marks("s2", [Mark(unit(3), 0.93, 3.0, "acme")])
    assert sorted(b.mark_scopes()) == ["s1", "s2"]
    assert [m.tenant for m in b.marks("s1")] == ["acme", "umbrella"]
    b.rewrite_marks("s1", [m for m in b.marks("s1") if m.tenant != "acme"])
    b.rewrite_marks("s2", [])
    assert [m.tenant for m in a.marks("s1")] == ["umbrella"] and a.marks("s2") == [] and a.mark_scopes() == ["s1"]
    time.sleep(0.6)
    assert a.marks("s1") == []  # the expiry stayed
    b.rewrite_marks("s1", [Mark(unit(4), 0.94, 4.0)])  # never recreated once gone
    assert a.marks("s1") == []


def test_change_log_lists_adds_and_deletes_of_every_handle(open_store: Opener) -> None:
    a, b = open_store(), open_store()
    kept, gone = new_entry(a, key="kept"), new_entry(a, key="gone")
    a.put(kept, unit(1))
    a.put(gone, unit(2))
    start = b.log_position()
    (reserved,) = a.allocate(1)  # allocated, not stored yet: may be listed, and does not load
    fresh = new_entry(a, key="fresh")
    a.put(fresh, unit(3))
    assert a.delete(gone.id) and not a.delete(10_000)  # a delete of nothing is not logged
    cursor, added, removed = b.read_log(start)
    assert fresh.id in added and kept.id not in added and gone.id not in added
    assert removed == [gone.id]
    assert b.load(reserved) is None
    assert b.read_log(cursor)[1:] == ([], [])  # nothing new since
    b.delete(kept.id)
    assert a.read_log(cursor)[2] == [kept.id]


def test_a_pointer_to_another_requests_entry_is_damage(open_store: Opener) -> None:
    a, b = open_store(), open_store()
    entry = new_entry(a, key="k1")
    a.put(entry, unit(1))
    entry.exact_key = "k2"  # the record no longer answers k1 while k1 still points at it
    assert a.rewrite(entry)
    assert b.get_exact("k1") is None and b.damaged == 1  # never another request's answer
    assert b.exact_id("k1") is None and b.get(entry.id) == entry  # the pointer is gone, not the entry


# ---------------------------------------------------------------- disk store's own damage handling
def test_disk_entry_under_the_wrong_id_is_damage(tmp_path: Path) -> None:
    store = DiskEntryStore(tmp_path, DIM)
    first, second = new_entry(store, key="a"), new_entry(store, key="b")
    store.put(first)
    store.put(second)
    store.cache.set(f"e:{second.id}", first.to_bytes())  # a page copied over another
    assert store.get(second.id) is None and store.get_exact("b") is None and store.damaged >= 1
    assert {s.entry.id for s in store.scan()} == {first.id}
    store.close()


def test_disk_index_rows_read_as_diskcache_writes_them(tmp_path: Path) -> None:
    """Pointers and index rows go in with one batched statement; diskcache must read, count,
    expire and cull them as if `set` had written them."""
    store = DiskEntryStore(tmp_path, DIM)
    entry = dataclasses.replace(new_entry(store, key="k", ttl=0.4), tenant="t", tags=["doc:1"])
    store.put(entry, ttl=0.4)
    cache = store.cache
    assert cache.get("x:k") == entry.id and cache.get(f"g:doc:1|{entry.id}") == 1
    assert cache.get(f"g:{tenant_term('t')}|{entry.id}") == 1
    _, expire_time = cache.get("x:k", expire_time=True)
    assert expire_time is not None and 0 < expire_time - time.time() <= 0.4
    assert len(cache) == sum(1 for _ in cache.iterkeys())  # diskcache's own row count kept by its triggers
    store.cache.set("x:k", 99)  # diskcache's set over a batched row replaces it
    assert cache.get("x:k") == 99
    time.sleep(0.5)
    cache.set("other", 1)  # a later set culls expired rows, the batched ones with the rest
    assert cache.get(f"g:doc:1|{entry.id}") is None
    assert len(cache) == sum(1 for _ in cache.iterkeys())
    store.close()


def test_disk_unreadable_entry_is_counted_deleted_and_logged(tmp_path: Path) -> None:
    store = DiskEntryStore(tmp_path, DIM)
    entry = new_entry(store, key="k")
    store.put(entry, unit(1))
    start = store.log_position()
    store.cache.set(f"e:{entry.id}", b"\x00not json")  # sealed, so only the JSON check can catch it
    assert store.get_exact("k") is None and store.damaged == 1
    assert store.vector(entry.id) is None and store.read_log(start)[2] == [entry.id]
    store.close()


# ---------------------------------------------------------------- redis store's own damage and log handling
def redis_handle(server: RedisServer, prefix: str = "own:") -> RedisEntryStore:
    return RedisEntryStore(RedisLink(LinkSettings(server.url)), DIM, key_prefix=prefix)


def test_redis_damaged_value_is_a_miss_and_deleted(redis_server: RedisServer) -> None:
    store = redis_handle(redis_server)
    entry = new_entry(store, key="k")
    store.put(entry, unit(1))
    start = store.log_position()
    raw = store.link.client.hget(f"own:e:{entry.id}", "j")
    flipped = raw[:-3] + bytes([raw[-3] ^ 1]) + raw[-2:]  # one bit of the answer
    store.link.client.hset(f"own:e:{entry.id}", "j", flipped)
    assert store.get_exact("k") is None and store.damaged == 1
    assert not store.link.client.exists(f"own:e:{entry.id}") and store.exact_id("k") is None
    assert store.read_log(start)[2] == [entry.id]
    store.close()


def test_redis_entry_under_the_wrong_id_is_damage(redis_server: RedisServer) -> None:
    store = redis_handle(redis_server)
    first, second = new_entry(store, key="a"), new_entry(store, key="b")
    store.put(first)
    store.put(second)
    r = store.link.client
    r.hset(f"own:e:{second.id}", "j", r.hget(f"own:e:{first.id}", "j"))  # intact, under another id
    assert store.get(second.id) is None and store.get_exact("b") is None and store.damaged >= 1
    assert {s.entry.id for s in store.scan()} == {first.id}
    store.close()


def test_redis_log_trimmed_past_or_reset_is_a_gap(redis_server: RedisServer) -> None:
    store = RedisEntryStore(RedisLink(LinkSettings(redis_server.url)), DIM, key_prefix="gap:", log_max=1)
    start = store.log_position()
    for _ in range(300):  # MAXLEN ~1 trims whole stream nodes (100 entries each) past `start`
        store.put(new_entry(store))
    with pytest.raises(LogGap):
        store.read_log(start)
    fresh = store.log_position()
    assert store.read_log(fresh)[1:] == ([], [])
    redis_server.restart()  # empty: the epoch is gone, and ids never restart from 1
    with pytest.raises(LogGap):
        store.read_log(fresh)
    assert store.allocate(1)[0] > 10**15
    store.close()


def test_an_entry_orjson_cannot_write_is_written_by_json(tmp_path: Path) -> None:
    """An answer with an integer past 64 bits or a non-string key still stores and reads back."""
    entry = CacheEntry(1, "s", {"seed": 2**70, "bias": {5: 1.0}}, exact_key="k", text="q")
    back = CacheEntry.from_bytes(entry.to_bytes())
    assert back.response == {"seed": 2**70, "bias": {"5": 1.0}} and back.exact_key == "k"
