"""Encryption at rest: AES-256-GCM under keys that HKDF-SHA256 derives from one master key.

The master key comes from an environment variable that the config names (never from a config
file); `parse_master_key` turns that variable's text into bytes. Nothing is encrypted under the
master itself; each use derives its own key:

    entry key  = HKDF-SHA256(master, salt=none,       info="kvgate entries v1" NUL scope)
    chunk key  = HKDF-SHA256(master, salt=cache_salt, info="kvgate kv v1")   (no salt: salt=none)

A response entry (its answer, its question vector, its scope's feedback marks) is readable only
under its scope's key (a scope digest holds the tenant on tenant-scoped routes), and a KV chunk
only with the cache_salt of the request that wrote it: the tenant's current salt. A sealed value:

    entries:  b"KVE1" | scope length u16 LE | scope (UTF-8) | nonce (12) | ciphertext | tag (16)
    chunks:   ciphertext | tag (16) | nonce (12) | b"KVX1"

(a chunk's framing trails its ciphertext so that a chunk read into a fresh buffer is decrypted in
place, its plaintext starting where the buffer does: the codec takes that buffer over, and an
encrypted load costs one AES-GCM pass over the bytes and no copy).

The nonce is random per value; the value's storage key is the associated data, so a value copied
under another key fails authentication, as does a flipped bit, a value sealed under another master
key (after a rotation), or a plaintext value written before encryption was turned on: `open`
raises AuthFailed, counted per layer in `failures`, and every caller reads it as a miss. An entry
carries its scope in the clear (an opaque digest) because a process that follows another's writes
must open entries of scopes it has never searched; a chunk carries nothing of its salt.

Random 96-bit nonces stay within NIST SP 800-38D's bound (2^32 values per key) far past any cache
this holds: every salt and every scope has a key of its own.
"""

from __future__ import annotations

import base64
import binascii
import os
import struct
import threading
from collections import OrderedDict
from typing import Any, Callable

MASTER_MIN_BYTES = 32
NONCE = 12
TAG = 16
ENTRIES_INFO = b"kvgate entries v1"
KV_INFO = b"kvgate kv v1"
ENTRY_MAGIC = b"KVE1"
CHUNK_MAGIC = b"KVX1"
_SCOPE_LEN = struct.Struct("<H")
KEYS_KEPT = 4096  # derived keys cached per cipher: the hot path runs HKDF once per scope or salt


class AuthFailed(ValueError):
    """A sealed value did not authenticate: damaged, moved, of another key, or never sealed."""


def parse_master_key(text: str) -> bytes:
    """The master key from its environment variable's text: hex or base64 of at least 32 random
    bytes (`openssl rand -hex 32`). Raises ValueError, naming neither the text nor any of it."""
    text = text.strip()
    for decode in (
        bytes.fromhex,
        lambda t: base64.b64decode(t, validate=True),
        lambda t: base64.b64decode(t, altchars=b"-_", validate=True),
    ):
        try:
            key = decode(text)
        except (ValueError, binascii.Error):
            continue
        if len(key) >= MASTER_MIN_BYTES:
            return key
    raise ValueError(
        f"must hold at least {MASTER_MIN_BYTES} random bytes as hex or base64 (e.g. the output of `openssl rand -hex 32`)"
    )


def derive_key(master: bytes, info: bytes, salt: bytes | None = None) -> bytes:
    """HKDF-SHA256(master, salt, info), 32 bytes. Invariant: the same (master, salt, info) gives the
    same key in every process; any other salt or info gives an independent key, and no derived
    key reveals the master or another derived key."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(master)


def entry_key(master: bytes, scope: str) -> bytes:
    """The key of a response entry's values: one per scope (and so one per tenant at least).
    Invariant: two scopes never share a key; the scope is length-delimited by the info's end."""
    return derive_key(master, ENTRIES_INFO + b"\0" + scope.encode())


def chunk_key(master: bytes, cache_salt: str | None) -> bytes:
    """The key of a KV chunk written for a request with `cache_salt`; unsalted requests share the
    key derived from the master alone. Invariant: without the salt, a salted chunk's key cannot
    be derived, even with the master key."""
    return derive_key(master, KV_INFO, cache_salt.encode() if cache_salt else None)


class Keyring:
    """AES-GCM objects of derived keys, the least recently used dropped past `kept` (thread-safe)."""

    def __init__(self, master: bytes, derive: Callable[[bytes, Any], bytes], kept: int = KEYS_KEPT) -> None:
        # imported here, not at the top: a process without encryption never loads the library
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if len(master) < MASTER_MIN_BYTES:
            raise ValueError(f"a master key needs at least {MASTER_MIN_BYTES} bytes")
        self._master, self._derive, self._kept = master, derive, kept
        self._aead_of, self.invalid_tag = AESGCM, InvalidTag
        self._aeads: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, label: Any) -> Any:
        with self._lock:
            aead = self._aeads.get(label)
            if aead is not None:
                self._aeads.move_to_end(label)
                return aead
        aead = self._aead_of(self._derive(self._master, label))  # outside the lock: HKDF is the slow part
        with self._lock:
            self._aeads[label] = aead
            while len(self._aeads) > self._kept:
                self._aeads.popitem(last=False)
        return aead


class _Counted:
    """Authentication failures by layer (what kvgate_decrypt_failures_total exports)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: dict[str, int] = {}

    @property
    def failures(self) -> dict[str, int]:
        with self._lock:
            return dict(self._failures)

    def _failed(self, layer: str | None, why: str) -> AuthFailed:
        if layer is not None:
            with self._lock:
                self._failures[layer] = self._failures.get(layer, 0) + 1
        return AuthFailed(why)


class EntryCipher(_Counted):
    """Seals the response cache's values (entries, vectors, marks) under their scope's key."""

    def __init__(self, master: bytes, kept: int = KEYS_KEPT) -> None:
        super().__init__()
        self._keys = Keyring(master, entry_key, kept)

    def seal(self, plain: bytes, scope: str, where: str) -> bytes:
        """`plain` sealed for storage key `where` (bytes: the stores' layers take only bytes)."""
        label = scope.encode()
        nonce = os.urandom(NONCE)
        body = self._keys.get(scope).encrypt(nonce, plain, where.encode())
        return b"".join((ENTRY_MAGIC, _SCOPE_LEN.pack(len(label)), label, nonce, body))

    def open(self, sealed: bytes | bytearray | memoryview, where: str, layer: str | None) -> bytes:
        """The plaintext sealed for `where`; AuthFailed otherwise, counted under `layer` (None: a
        second look at a value already counted)."""
        view = memoryview(sealed)
        head = len(ENTRY_MAGIC) + _SCOPE_LEN.size
        if len(view) < head or view[: len(ENTRY_MAGIC)] != ENTRY_MAGIC:
            raise self._failed(layer, f"{where}: not a sealed entry value")
        (n,) = _SCOPE_LEN.unpack_from(view, len(ENTRY_MAGIC))
        if len(view) < head + n + NONCE + TAG:
            raise self._failed(layer, f"{where}: sealed value too short")
        try:
            scope = bytes(view[head : head + n]).decode()
            nonce = view[head + n : head + n + NONCE]
            return self._keys.get(scope).decrypt(nonce, view[head + n + NONCE :], where.encode())
        except (self._keys.invalid_tag, UnicodeDecodeError):
            raise self._failed(layer, f"{where}: authentication failed") from None


def seal_with(cipher: EntryCipher | None, plain: bytes, scope: str, where: str) -> bytes:
    """`plain` as an entry store writes it at `where`: sealed under `scope`'s key with a cipher,
    unchanged without one (the format of a store that never had encryption)."""
    return plain if cipher is None else cipher.seal(plain, scope, where)


def open_with(cipher: EntryCipher | None, stored: bytes, where: str, layer: str | None) -> bytes:
    """Inverse of `seal_with`; AuthFailed (counted under `layer`) for what does not open."""
    return stored if cipher is None else cipher.open(stored, where, layer)


class ChunkCipher(_Counted):
    """Seals KV chunks under the key of their request's cache_salt, without extra copies."""

    layer = "kv"
    TRAILER = TAG + NONCE + len(CHUNK_MAGIC)

    def __init__(self, master: bytes, kept: int = KEYS_KEPT) -> None:
        super().__init__()
        self._keys = Keyring(master, chunk_key, kept)

    def seal(self, plain: bytes | bytearray | memoryview, key: str, salt: str | None) -> bytearray:
        """`plain` sealed for store key `key`, written once into a new buffer."""
        n = len(plain)
        out = bytearray(n + self.TRAILER)
        nonce = os.urandom(NONCE)
        self._keys.get(salt).encrypt_into(nonce, plain, key.encode(), memoryview(out)[: n + TAG])
        out[n + TAG :] = nonce + CHUNK_MAGIC
        return out

    def open(self, sealed: bytes | bytearray, key: str, salt: str | None) -> bytes | bytearray:
        """The plaintext chunk sealed under `key` with `salt`; AuthFailed (counted) otherwise. A
        bytearray is decrypted in place and returned shortened (the caller hands over a fresh
        buffer and keeps no other use of it); bytes are decrypted into a new bytearray."""
        n = len(sealed) - self.TRAILER
        if n < 0 or sealed[-len(CHUNK_MAGIC) :] != CHUNK_MAGIC:
            raise self._failed(self.layer, f"chunk {key!r}: not a sealed chunk")
        nonce = bytes(sealed[n + TAG : n + TAG + NONCE])
        in_place = isinstance(sealed, bytearray)
        out = sealed if in_place else bytearray(n)
        view, target = memoryview(sealed), memoryview(out)
        try:
            # in place: the output starts exactly where the input does, which AES-GCM allows
            self._keys.get(salt).decrypt_into(nonce, view[: n + TAG], key.encode(), target[:n])
        except self._keys.invalid_tag:
            raise self._failed(
                self.layer, f"chunk {key!r}: authentication failed (tampered, another key or another salt)"
            ) from None
        finally:
            view.release()
            target.release()
        if in_place:
            del out[n:]  # a shrink at the end: no copy
        return out
