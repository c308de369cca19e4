"""kvgate.index.storage.wal.WalCheckpointer: the WAL is copied into the database by its own thread, never blocking."""

from __future__ import annotations

import logging
import sqlite3
import time

from kvgate.index.storage.wal import WalCheckpointer
from tests.conftest import wait_until


def test_checkpointer_moves_the_log_into_the_database(tmp_path):
    db = tmp_path / "cache.db"
    writer = sqlite3.connect(str(db), isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")  # only the checkpointer may copy the log back
    writer.execute("CREATE TABLE t (v BLOB)")
    for _ in range(64):
        writer.execute("INSERT INTO t VALUES (?)", (b"x" * 16384,))
    assert db.stat().st_size < 64 * 16384  # the rows are in the WAL, not yet in the database
    wal = WalCheckpointer(db, logging.getLogger("test"), interval_s=0.02)
    try:
        assert wait_until(lambda: wal.rounds >= 1, 10.0)
        assert db.stat().st_size >= 64 * 16384  # checkpointed while the writer's connection stayed open
        writer.execute("INSERT INTO t VALUES (?)", (b"y",))  # and the writer never waited on it
        assert writer.execute("SELECT count(*) FROM t").fetchone()[0] == 65
        assert wait_until(lambda: wal.rounds >= 2, 10.0)  # the new write is checkpointed too
        # an idle log: rounds find it unchanged, checkpoint nothing and wait longer each time
        done = wal.rounds
        assert wait_until(lambda: wal.skipped >= 3, 10.0) and wal.rounds == done
        writer.execute("INSERT INTO t VALUES (?)", (b"z" * 16384,))
        assert wait_until(lambda: wal.rounds > done, 10.0)  # a write after the pause: checkpointed again
    finally:
        wal.close()
        writer.close()
    assert not wal._thread.is_alive()


def test_checkpointer_failures_are_logged_once_and_never_raised(tmp_path, caplog):
    gone = tmp_path / "missing" / "cache.db"  # its directory does not exist: every round fails
    with caplog.at_level(logging.INFO, logger="test-wal"):
        wal = WalCheckpointer(gone, logging.getLogger("test-wal"), interval_s=0.02)
        time.sleep(0.3)
        wal.close()
    logged = [r for r in caplog.records if "WAL checkpoint" in r.getMessage()]
    assert len(logged) == 1 and wal.rounds == 0
    assert not wal._thread.is_alive()
