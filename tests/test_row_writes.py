"""The stores' rows written in one statement (kvgate.index.storage.disk_sql.put_ints) instead of
diskcache's `set`: an answer's entry with its pointer and index rows, a group commit's request
records. What `set` did on the way (sealing, culling expired rows, the log's size bound, failures
that cost the record and nothing else) must still hold."""

from __future__ import annotations

import sqlite3
import threading
import time

import diskcache
import pytest

from kvgate.index.responses.entries import disk as entries_disk
from kvgate.index.responses.entries.base import CacheEntry
from kvgate.index.responses.entries.disk import DiskEntryStore
from kvgate.index.storage.disk_sql import get_int, put_ints
from kvgate.middleware.cache import request_log as request_log_mod
from kvgate.middleware.cache.request_log import DiskRequestLog, RequestRecord, new_request_id

DIM = 8


def _rows(directory, like: str) -> list[tuple]:
    conn = sqlite3.connect(str(directory / diskcache.core.DBNAME))
    try:
        return conn.execute(
            "SELECT key, mode, filename, size FROM Cache WHERE key LIKE ? ORDER BY key", (like,)
        ).fetchall()
    finally:
        conn.close()


def test_an_entry_is_a_sealed_row_or_a_file_and_reads_back(tmp_path):
    store = DiskEntryStore(tmp_path, DIM)
    try:
        small = CacheEntry(1, "scope", {"answer": "short"}, exact_key="k1", tenant="t", tags=["doc:1"])
        big = CacheEntry(2, "scope", {"answer": "x" * 40_000}, exact_key="k2")
        with store.batch():
            store.put(small)
            store.put(big)
        assert store.get_exact("k1").response == {"answer": "short"}
        assert store.get_exact("k2").response == {"answer": "x" * 40_000}
        assert store.tagged("doc:1") == [1]
        (_, mode, filename, _), (_, _, big_file, _) = _rows(tmp_path, "e:%")
        assert (mode, filename) == (1, None) and big_file is not None  # a row; a file of its own
    finally:
        store.close()
    # the row is sealed: a changed byte reads as absent, counted as damage
    conn = sqlite3.connect(str(tmp_path / diskcache.core.DBNAME))
    (value,) = conn.execute("SELECT value FROM Cache WHERE key = 'e:1'").fetchone()
    flipped = bytearray(value)
    flipped[-3] ^= 0x01
    conn.execute("UPDATE Cache SET value = ? WHERE key = 'e:1'", (bytes(flipped),))
    conn.commit()
    conn.close()
    again = DiskEntryStore(tmp_path, DIM)
    try:
        assert again.get_exact("k1") is None and again.damaged == 1
    finally:
        again.close()


def test_expired_entry_rows_are_culled_as_entries_are_written(tmp_path, monkeypatch):
    monkeypatch.setattr(entries_disk, "CULL_EVERY", 4)
    store = DiskEntryStore(tmp_path, DIM)
    try:
        store.put(CacheEntry(1, "scope", {"a": 1}, exact_key="old"), ttl=0.05)
        time.sleep(0.1)
        assert store.get_exact("old") is None  # expired: never read
        assert _rows(tmp_path, "x:old")  # but still a row until a cull
        for i in range(2, 6):
            store.put(CacheEntry(i, "scope", {"a": i}, exact_key=f"k{i}"))
        assert not _rows(tmp_path, "x:old") and not _rows(tmp_path, "e:1")
        assert store.get_exact("k5").response == {"a": 5}
    finally:
        store.close()


def test_put_ints_refuses_a_value_set_would_keep_in_a_file(tmp_path):
    cache = diskcache.Cache(str(tmp_path))
    try:
        with pytest.raises(ValueError, match="shorter than"):
            put_ints(cache, {"a": b"x" * cache.disk.min_file_size}, None)
    finally:
        cache.close()


def test_a_batchs_records_are_one_write_read_by_its_thread_and_another_handle(tmp_path):
    log = DiskRequestLog(tmp_path, ttl=60, max_bytes=10**7)
    other = DiskRequestLog(tmp_path, ttl=60, max_bytes=10**7)
    try:
        rids = [new_request_id() for _ in range(5)]
        with log.batch():
            for i, rid in enumerate(rids):
                log.record(rid, RequestRecord("t", "r", "miss", "s", i))
            assert log.get(rids[2]).entry_id == 2  # its own batch, before the commit
            assert other.get(rids[2]) is None  # not committed yet
        assert [other.get(rid).entry_id for rid in rids] == list(range(5))
        outside = new_request_id()
        log.record(outside, RequestRecord("t", "r", "exact", "s", 9))  # outside a batch: written at once
        assert other.get(outside).tier == "exact"
    finally:
        other.close()
        log.close()


def test_the_request_log_stays_within_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(request_log_mod, "CULL_EVERY", 16)
    bound = 256 * 1024
    log = DiskRequestLog(tmp_path, ttl=3600, max_bytes=bound)
    try:
        record = RequestRecord("t" * 64, "route", "miss", "s" * 64, 1)
        first = new_request_id()
        with log.batch():
            log.record(first, record)
        for _ in range(300):
            with log.batch():
                for _ in range(8):
                    log.record(new_request_id(), record)
        assert log._disk.volume() <= bound * 1.25  # noqa: SLF001  (the size diskcache culls by)
        assert log.get(first) is None  # the least recently stored went first
        assert log.stats()["storage_errors"] == 0
    finally:
        log.close()


def test_a_failed_write_of_a_batchs_records_costs_those_records_only(tmp_path, monkeypatch, caplog):
    log = DiskRequestLog(tmp_path, ttl=60, max_bytes=10**7)

    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    try:
        monkeypatch.setattr(request_log_mod, "put_ints", full)
        rid = new_request_id()
        with log.batch():
            log.record(rid, RequestRecord("t", "r", "miss", "s", 1))
        assert log.get(rid) is None and log.stats()["storage_errors"] == 1
        monkeypatch.undo()
        with log.batch():
            log.record(rid, RequestRecord("t", "r", "miss", "s", 1))
        assert log.get(rid).entry_id == 1
    finally:
        log.close()


def test_get_int_reads_live_integers_only(tmp_path):
    cache = diskcache.Cache(str(tmp_path))
    try:
        put_ints(cache, {"n": 7, "b": b"bytes", "old": 3}, None)
        put_ints(cache, {"gone": 5}, 0.05)
        cache.set("via-set", 11)
        cache.set("text", "7")
        time.sleep(0.1)
        assert get_int(cache, "n") == 7 and get_int(cache, "via-set") == 11  # put_ints's rows and set's alike
        assert get_int(cache, "absent") is None and get_int(cache, "gone") is None  # absent; expired
        assert get_int(cache, "b") is None and get_int(cache, "text") is None  # not an integer
    finally:
        cache.close()


def _entry_rows(directory) -> int:
    return len(_rows(directory, "e:%"))


def test_puts_in_a_batch_join_its_transaction_and_puts_outside_commit_at_once(tmp_path):
    store = DiskEntryStore(tmp_path, DIM)
    try:
        with store.batch():
            store.put(CacheEntry(1, "scope", {"a": 1}, exact_key="k1"))
            store.put(CacheEntry(2, "scope", {"a": 2}, exact_key="k2"))
            assert _entry_rows(tmp_path) == 0  # another connection: nothing until the batch commits
            assert store.exact_id("k2") == 2  # its own writes, read inside the batch
        assert _entry_rows(tmp_path) == 2
        store.put(CacheEntry(3, "scope", {"a": 3}, exact_key="k3"))
        assert _entry_rows(tmp_path) == 3  # no batch: its own transaction, committed
    finally:
        store.close()


def test_a_put_from_another_thread_during_a_batch_is_not_part_of_it(tmp_path):
    store = DiskEntryStore(tmp_path, DIM)
    try:
        with store.batch():
            store.put(CacheEntry(1, "scope", {"a": 1}, exact_key="k1"))
            done = threading.Thread(target=store.put, args=(CacheEntry(2, "scope", {"a": 2}, exact_key="k2"),))
            done.start()
            time.sleep(0.2)  # it waits for the batch's lock rather than writing into the batch
            assert _entry_rows(tmp_path) == 0
        done.join(10)
        assert not done.is_alive() and _entry_rows(tmp_path) == 2
        assert store.get_exact("k2").response == {"a": 2}
    finally:
        store.close()
