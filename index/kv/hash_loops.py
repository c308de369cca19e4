"""The prompt hasher's two SHA-256 loops, as pure functions over bytes.

They run on every routed request, once per segment of the prompt and once per block of its new
tokens, so they exist twice: here in Python, and in `_hash_loops.c`, a C extension with the same
names and contracts that `pip install` builds where a C compiler and OpenSSL's headers are found
(setup.py; the build is optional and a failed one leaves this module in use). `loops()` gives the
C one when it is importable. tests/test_hash_loops.py holds both to the same results.

May import: kvgate.index.kv.native (which of the twins runs); the C module nothing.
"""

from __future__ import annotations

import hashlib
import sys
from types import ModuleType
from typing import Sequence

from kvgate.index.kv.native import twin


def segment_digests(root: bytes, materials: Sequence[str | bytes]) -> list[bytes]:
    """The running digests of a prompt's segments: d_k = SHA-256(d_{k-1} || material_k), d_-1 =
    `root` (32 bytes); a str material counts as its UTF-8 bytes (strict, as str.encode gives)."""
    if len(root) != 32:
        raise ValueError("root must be 32 bytes")
    sha = hashlib.sha256
    d = root
    out = []
    for material in materials:
        d = sha(d + (material.encode() if isinstance(material, str) else material)).digest()
        out.append(d)
    return out


def chain_digests(packed: bytes | memoryview, step: int, parent: bytes, prefix: bytes) -> bytes:
    """The chained block digests of packed tokens, end to end: `step` bytes per block (4 ×
    block_size), `parent` the 8-byte digest before the first block, `prefix` the extra keys as
    every block carries them (kvgate.index.kv.hashing.extra_prefix). Digest i = the first 8 bytes
    of SHA-256(digest i-1 || prefix || block i); the partial tail is not hashed."""
    if step <= 0:
        raise ValueError("step must be positive")
    if len(parent) != 8:
        raise ValueError("parent must be 8 bytes")
    h = parent
    end = len(packed) - len(packed) % step
    sha = hashlib.sha256
    out = []
    for off in range(0, end, step):  # the hot loop: bytes in, bytes out, no int conversions
        h = sha(h + prefix + packed[off : off + step]).digest()[:8]
        out.append(h)
    return b"".join(out)


def python_loops() -> ModuleType:
    """This module: the loops in Python."""
    return sys.modules[__name__]


def loops() -> ModuleType:
    """The C loops when the extension was built, else the Python ones."""
    return twin("kvgate.index.kv._hash_loops", __name__)


def native() -> bool:
    """Whether the C loops are the ones in use here."""
    return loops() is not python_loops()
