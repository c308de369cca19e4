"""Checkpoints of a diskcache directory's SQLite write-ahead log, taken off the request path.

In WAL mode SQLite copies the log back into the database (a checkpoint) inside the commit that
takes the log past `wal_autocheckpoint` pages (1,000 by default), and with `synchronous=NORMAL`
(diskcache's setting) that checkpoint syncs the log and the database to disk: the writer whose
commit crossed the mark waits for both. A store that writes on a request's path (the exact
tier's answer before `[DONE]`, the request log) runs a `WalCheckpointer`: a PASSIVE checkpoint
every `interval_s` on a thread of its own, so the log seldom reaches the mark in a commit.
PASSIVE never waits for readers or writers; frames a reader still needs are left for a later
round. Processes without one (or after it stops) keep SQLite's own checkpoints, so the log stays
bounded either way.

A round whose log has not changed since the last checkpoint (same size and modification time)
checkpoints nothing, and the wait until the next one doubles, up to IDLE_FACTOR × `interval_s`:
an idle proxy's store wakes this thread a few times a minute instead of twice a second, and the
first write after a pause is checkpointed within that longer wait, then every `interval_s` again.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path

INTERVAL_S = 0.5  # at 40 long answers/s a store writes ~300 pages/s: well under the 1,000-page mark
IDLE_FACTOR = 8  # the longest wait, in intervals, while the log does not change (far below the mark)


class WalCheckpointer:
    """A thread that checkpoints one SQLite database's WAL every `interval_s` until `close`.

    Invariant: it only ever runs PASSIVE checkpoints on its own connection, so it never blocks a
    reader or a writer of the database and never changes its contents; a failure is logged once
    per run of failures and the next round tries again."""

    def __init__(self, db: Path, log: logging.Logger, interval_s: float = INTERVAL_S) -> None:
        self.db, self.interval_s, self._log = db, interval_s, log
        self.rounds = 0  # checkpoints that ran (tests and diagnostics)
        self.skipped = 0  # rounds that found the log as the last checkpoint left it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kvgate-wal {db.parent.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        failing = False
        wait, seen = self.interval_s, None
        try:
            while not self._stop.wait(wait):
                now = self._log_state()
                if now is not None and now == seen:  # nothing written since: wait longer
                    self.skipped += 1
                    wait = min(wait * 2, self.interval_s * IDLE_FACTOR)
                    continue
                wait = self.interval_s
                try:
                    if conn is None:
                        conn = sqlite3.connect(str(self.db), isolation_level=None)
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    self.rounds += 1
                    seen = now
                    failing = False
                except sqlite3.Error as exc:  # the directory went away, a full disk…: SQLite's own checkpoints remain
                    if not failing:  # the store's own writes report the fault (a full disk) as a warning
                        self._log.info(
                            "WAL checkpoint of %s failed (%s); SQLite's own checkpoints go on, will retry", self.db, exc
                        )
                    failing = True
                    if conn is not None:
                        conn.close()
                        conn = None
        finally:
            if conn is not None:
                conn.close()

    def _log_state(self) -> tuple[int, int] | None:
        """The log file's (size, modification time), None when it cannot be read (no log yet)."""
        try:
            st = os.stat(f"{self.db}-wal")
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
