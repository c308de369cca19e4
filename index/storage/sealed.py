"""Sealed values: bytes with a magic and a SHA-256, so damage on disk is detected, never served.

SQLite checksums nothing and diskcache's value files are plain files: a flipped bit inside a
stored answer would otherwise come back as a different, valid-looking answer. The semantic index's
diskcache uses `SealedDisk`, which seals every bytes value; `unseal` raises Damaged for anything that is not exactly what
was sealed (wrong magic, short, extended, any changed byte).

    offset 0   magic   b"KVS1"   4 bytes
    offset 4   digest  SHA-256 of the payload   32 bytes
    offset 36  payload
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any

import diskcache
from diskcache.core import MODE_PICKLE, UNKNOWN

log = logging.getLogger("kvgate.sealed")

MAGIC = b"KVS1"
_HEAD = len(MAGIC) + 32
SEAL_BYTES = _HEAD  # what `seal` adds to a payload


class Damaged(ValueError):
    """A stored value failed its integrity check."""


def seal(payload: bytes) -> bytes:
    return MAGIC + hashlib.sha256(payload).digest() + payload


def unseal(raw: bytes) -> bytes:
    """The payload of `seal(payload)`; raises Damaged otherwise."""
    if not isinstance(raw, (bytes, bytearray)) or len(raw) < _HEAD or raw[:4] != MAGIC:
        raise Damaged("not a sealed value (bad magic or too short)")
    payload = bytes(raw[_HEAD:])
    if hashlib.sha256(payload).digest() != bytes(raw[4:_HEAD]):
        raise Damaged("checksum mismatch")
    return payload


class SealedDisk(diskcache.Disk):
    """A diskcache Disk that seals every bytes value it stores and checks it on every fetch.

    A value that fails the check, whose file is gone, or that claims to be a pickle (never
    written by us, never unpickled) reads as absent — `Cache.get` returns its default — and is
    counted in `damaged` and logged. Ints (ids, counters) are SQLite integers and pass as they are.
    """

    def __init__(self, directory: str, **kwargs: Any) -> None:
        super().__init__(directory, **kwargs)
        self._lock = threading.Lock()
        self.damaged = 0

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> Any:
        if type(value) is bytes:
            value = seal(value)
        return super().store(value, read, key=key)

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode == MODE_PICKLE:
            self.report(filename, "a pickled value (never written by kvgate)")
            raise OSError("refusing to unpickle")  # diskcache turns OSError into "absent"
        try:
            out = super().fetch(mode, filename, value, read)
        except OSError as exc:  # value file deleted or unreadable
            self.report(filename, f"value file unreadable ({type(exc).__name__})")
            raise
        if hasattr(out, "read"):  # read=True handles: we hand back checked bytes instead
            with out:
                out = out.read()
        if isinstance(out, (bytes, bytearray)):
            try:
                return unseal(out)
            except Damaged as exc:
                self.report(filename, str(exc))
                raise OSError(str(exc)) from None
        return out

    def report(self, filename: str | None, why: str) -> None:
        """Count and log one damaged item (also used by callers that find damage above this layer)."""
        with self._lock:
            self.damaged += 1
        where = f"file {filename}" if filename else "value inside the database"
        log.warning("cache store %s: damaged %s (%s); read as absent", self._directory, where, why)
