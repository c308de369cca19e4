"""Opening a diskcache directory whose SQLite database may be damaged.

A database that fails SQLite's quick_check is moved aside (`<dir>.damaged-<time>`, kept for
inspection) and an empty store takes its place: a damaged file costs the cache, never the
service. Locked or full databases (OperationalError) are not damage and are raised as they are.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import diskcache


def quick_check(db: Path) -> None:
    """Raise sqlite3.DatabaseError when an existing database file fails SQLite's quick_check."""
    if not db.exists():
        return
    conn = sqlite3.connect(str(db), timeout=30)
    try:
        result = conn.execute("PRAGMA quick_check").fetchone()
    finally:
        conn.close()
    if not result or result[0] != "ok":
        raise sqlite3.DatabaseError(f"quick_check: {result[0] if result else 'no answer'}")


def open_cache(directory: Path, log: logging.Logger, **kwargs: Any) -> diskcache.Cache:
    """diskcache.Cache(directory, **kwargs), after moving a damaged database aside."""
    db = directory / diskcache.core.DBNAME
    try:
        quick_check(db)
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError):  # locked, disk full…: not damage, not ours to fix
            raise
        aside = directory.with_name(
            f"{directory.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6}"
        )
        directory.rename(aside)
        directory.mkdir(parents=True)
        log.error("cache database %s is damaged (%s): moved to %s, starting empty", db, exc, aside)
    return diskcache.Cache(str(directory), **kwargs)
