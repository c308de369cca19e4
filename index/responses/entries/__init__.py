"""Entry stores: where the response cache's answers, vectors and exact pointers live (base.py:
the EntryStore protocol and its records; one file per backend: disk.py, redis.py)."""

from kvgate.index.responses.entries.base import CacheEntry, ChangeLog, EntryStore, LogGap, Stored
from kvgate.index.responses.entries.disk import DiskEntryStore

__all__ = ["CacheEntry", "ChangeLog", "DiskEntryStore", "EntryStore", "LogGap", "Stored"]
