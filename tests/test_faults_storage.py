"""Storage faults in the response cache (issue 6, part 2): damaged entries, pointers, vectors and
value files are detected, served as misses and repaired; a damaged database is moved aside on
open and the proxy serves on; damage while serving makes misses, not errors.

Answers use the fake backend's `[[fixed]]` trigger ("Answer: <question>" on every call), so a
cold run's output is known and every later answer must be exactly it.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

QUESTIONS = {
    "inline": "[[fixed]] MARK_INLINE What is the capital of Portugal?",
    "flip": "[[fixed]] MARK_FLIP Summarise this report. " + "report line " * 3500,  # > 32 KB: a value file
    "truncate": "[[fixed]] MARK_TRUNC Summarise this memo. " + "memo line " * 4000,
    "delete": "[[fixed]] MARK_DEL Summarise this log. " + "log line " * 4500,
    "pointer": "[[fixed]] MARK_PTR How tall is Mount Fuji?",
    "vector": "[[fixed]] MARK_VEC Who painted the Mona Lisa?",
    "intact": "[[fixed]] MARK_OK How many legs does a spider have?",
}


def _ask(proxy: Any, question: str) -> tuple[str, str]:
    resp = proxy.chat(question)
    assert resp.status_code == 200, resp.text
    return resp.headers["x-kvgate-cache"], resp.json()["choices"][0]["message"]["content"]


def _rows(db: Path) -> list[tuple[int, str, Any, str | None]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT rowid, key, value, filename FROM Cache").fetchall()


def _value(directory: Path, row: tuple[int, str, Any, str | None]) -> bytes:
    _, _, value, filename = row
    return (directory / filename).read_bytes() if filename else bytes(value)


def _entry_row(directory: Path, marker: str) -> tuple[int, str, Any, str | None]:
    rows = [
        r for r in _rows(directory / "cache.db") if r[1].startswith("e:") and marker.encode() in _value(directory, r)
    ]
    assert len(rows) == 1, marker
    return rows[0]


def _checkpoint(db: Path) -> None:
    """Fold the write-ahead log into the file we are about to damage. (A stopped proxy process
    leaves no WAL; an in-thread one may leave idle connections whose late checkpoint would
    otherwise write pages back over our damage.)"""
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _damage(directory: Path) -> int:
    """Damage one item per kind, the way a disk does; returns how many items were damaged."""
    db = directory / "cache.db"
    rows = {
        m: _entry_row(directory, m)
        for m in ("MARK_INLINE", "MARK_FLIP", "MARK_TRUNC", "MARK_DEL", "MARK_PTR", "MARK_OK", "MARK_VEC")
    }
    inline = rows["MARK_INLINE"]
    assert inline[3] is None  # small answers live inside the SQLite file
    _checkpoint(db)
    raw = bytearray(db.read_bytes())
    at = raw.find(b"MARK_INLINE")
    while at >= 0:  # one flipped bit in each copy (a freed page may hold an old one); SQLite notices nothing
        raw[at] ^= 0x20
        at = raw.find(b"MARK_INLINE", at + 1)
    db.write_bytes(bytes(raw))
    for marker, how in (("MARK_FLIP", "flip"), ("MARK_TRUNC", "truncate"), ("MARK_DEL", "delete")):
        path = directory / str(rows[marker][3])
        data = bytearray(path.read_bytes())
        if how == "flip":
            data[len(data) // 2] ^= 0x01
            path.write_bytes(bytes(data))
        elif how == "truncate":
            path.write_bytes(bytes(data[: len(data) // 2]))
        else:
            path.unlink()
    ptr_id, other_id, vec_id = (int(rows[m][1][2:]) for m in ("MARK_PTR", "MARK_OK", "MARK_VEC"))
    with sqlite3.connect(db) as conn:
        # the exact pointer of one question now leads to another question's entry
        (n,) = (
            conn.execute("UPDATE Cache SET value = ? WHERE key LIKE 'x:%' AND value = ?", (other_id, ptr_id)).rowcount,
        )
        assert n == 1
        (blob,) = conn.execute("SELECT value FROM Cache WHERE key = ?", (f"v:{vec_id}",)).fetchone()
        flipped = bytearray(blob)
        flipped[100] ^= 0x80
        conn.execute("UPDATE Cache SET value = ? WHERE key = ?", (bytes(flipped), f"v:{vec_id}"))
    return 6


def test_damaged_entries_are_detected_served_as_misses_and_repaired(
    make_proxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    proxy = make_proxy(cache_dir=cache)
    cold = {name: _ask(proxy, q) for name, q in QUESTIONS.items()}
    assert all(tier == "miss" and text == f"Answer: {QUESTIONS[n]}" for n, (tier, text) in cold.items())
    proxy.stop()

    damaged = _damage(cache / "responses")
    with caplog.at_level(logging.WARNING):
        proxy = make_proxy(cache_dir=cache)
        second = {name: _ask(proxy, q) for name, q in QUESTIONS.items()}
    for name, (_tier, text) in second.items():
        assert text == cold[name][1], name  # identical to the cold run, damaged or not
    for name in ("inline", "flip", "truncate", "delete"):
        assert second[name][0] == "miss", name  # the damaged answer itself is never served
    assert second["intact"][0] == "exact" and second["vector"][0] == "exact"
    assert second["pointer"][0] in ("miss", "semantic")  # its own entry may still be found by meaning
    assert proxy.pipeline.index.stats()["damaged"] >= damaged  # every damaged item was noticed
    assert "damaged" in caplog.text

    third = {name: _ask(proxy, q) for name, q in QUESTIONS.items()}
    tiers = {n: tier for n, (tier, _) in third.items()}
    # repaired: each damaged answer was stored again by its miss (the pointer's question may keep
    # being answered by meaning from its own intact entry, which is as correct)
    assert all(t == "exact" for n, t in tiers.items() if n != "pointer"), tiers
    assert tiers["pointer"] == second["pointer"][0] or tiers["pointer"] == "exact", tiers
    assert {n: t for n, (_, t) in third.items()} == {n: t for n, (_, t) in cold.items()}


@pytest.mark.parametrize("damage", ["garbage_header", "truncated", "zeroed_pages"])
def test_damaged_database_is_moved_aside_and_the_proxy_serves(
    make_proxy, tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    proxy = make_proxy(cache_dir=cache, threshold=0.999)
    questions = [f"[[fixed]] Question {i}: what is {i} plus {i}?" for i in range(12)]
    for q in questions:
        _ask(proxy, q)
    proxy.stop()
    db = cache / "responses" / "cache.db"
    _checkpoint(db)
    raw = bytearray(db.read_bytes())
    if damage == "garbage_header":
        raw[:100] = b"\xa5" * 100
    elif damage == "truncated":
        del raw[len(raw) // 3 :]
    else:  # zero a run of pages in the middle (page size 4096)
        start = (len(raw) // 2) // 4096 * 4096
        raw[start : start + 3 * 4096] = bytes(3 * 4096)
    db.write_bytes(bytes(raw))

    with caplog.at_level(logging.ERROR, logger="kvgate.semantic"):
        proxy = make_proxy(cache_dir=cache)  # must not crash
    assert "is damaged" in caplog.text
    assert list(cache.glob("responses.damaged-*")), "the damaged store is kept aside for inspection"
    for q in questions[:5]:
        assert _ask(proxy, q) == ("miss", f"Answer: {q}")
        assert _ask(proxy, q) == ("exact", f"Answer: {q}")  # the fresh store works


def test_damage_while_serving_makes_misses_not_errors(make_proxy, tmp_path: Path) -> None:
    """Pages of the live database overwritten under a running proxy: every request still gets
    its correct answer (a miss where the cache cannot read), none gets an error."""
    cache = tmp_path / "cache"
    proxy = make_proxy(cache_dir=cache, threshold=0.999)  # near-identical questions must not share answers here
    questions = [f"[[fixed]] Item {i}: describe colour number {i}." for i in range(16)]
    for q in questions:
        _ask(proxy, q)
    db = cache / "responses" / "cache.db"
    size = db.stat().st_size
    with open(db, "r+b") as f:  # garbage over everything past the first page
        f.seek(4096)
        f.write(b"\x5a" * (size - 4096))
    for q in questions:
        tier, text = _ask(proxy, q)
        assert (tier, text[:40]) in (("miss", f"Answer: {q}"[:40]), ("exact", f"Answer: {q}"[:40]))
        assert text == f"Answer: {q}"
    assert _ask(proxy, "[[fixed]] a new question after the damage") == (
        "miss",
        "Answer: [[fixed]] a new question after the damage",
    )
    stats = proxy.pipeline.index.stats()
    assert stats["storage_errors"] + stats["damaged"] > 0, stats  # the damage was met, and absorbed
