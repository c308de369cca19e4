"""KV chunk serialization: self-describing, checksummed, no pickle.

Layout of one encoded chunk (all integers little-endian):

    offset 0   magic      b"KVGC"                     4 bytes
    offset 4   version    u16 (FORMAT_VERSION)        2 bytes
    offset 6   header_len u32                         4 bytes
    offset 10  header     UTF-8 JSON, header_len bytes:
                          {"key", "dtype", "n_layers", "shapes": [[...] per tensor], "byteorder",
                           "meta" (optional, a caller's JSON object, e.g. a tail's token ids)}
    ...        payload    raw tensor bytes in order k0 v0 k1 v1 … (C order, native = little endian)
    ...        checksum   XXH3-128 of every byte before it        16 bytes

Invariants that `decode_chunk` enforces (any violation raises CorruptChunk, never returns data):
  * magic, version and every length agree exactly with len(data) (no trailing bytes, no short
    payload), so a truncated or extended file is rejected before its bytes are interpreted;
  * the checksum matches, so a torn write or flipped bit is rejected;
  * the key stored inside equals the key asked for, so a value filed under the wrong key (a
    renamed file, a misdirected write) is rejected even though its checksum is valid.
XXH3-128 rather than SHA-256 (format version 1): the checksum guards against damage, not against
an adversary who can write the cache directory (who could as well write valid chunks), and it
runs an order of magnitude faster than SHA-256, whose cost rivalled reading the file from disk. Version-1 chunks read as CorruptChunk (a miss; they are recomputed and rewritten).
"""

from __future__ import annotations

import json
import math
import struct
import sys
from typing import Any

import torch
import xxhash

KVChunk = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer (keys, values), each [kv_heads, chunk_tokens, head_dim], contiguous, on the CPU."""

MAGIC = b"KVGC"
FORMAT_VERSION = 2
_PREFIX = struct.Struct("<4sHI")  # magic, version, header_len
_DIGEST_SIZE = 16
PAYLOAD_ALIGN = 64
_MAX_HEADER = 1 << 20  # a sane bound so a corrupt length cannot make us slice absurdly

# Only dtypes a KV cache is kept in. bfloat16 has no numpy dtype, so bytes are always moved as
# raw storage (views as uint8), never through numpy's dtype system.
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class CorruptChunk(ValueError):
    """Stored bytes are not a valid chunk for the requested key (damaged, truncated, misfiled)."""


def raw_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes without copying (it must be contiguous and on the CPU)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _digest(parts: list[bytes | memoryview]) -> bytes:
    h = xxhash.xxh3_128()
    for p in parts:
        h.update(p)
    return h.digest()


def encode_chunk(chunk: KVChunk, key: str, meta: dict[str, Any] | None = None) -> bytes:
    """Serialize `chunk` under `key`, with an optional JSON-able `meta` object covered by the
    checksum. One copy of the tensor bytes (into the result).

    Raises ValueError for an empty chunk, mixed dtypes or an unsupported dtype (a caller bug,
    not corruption).
    """
    if not chunk:
        raise ValueError("a KV chunk needs at least one layer")
    tensors: list[torch.Tensor] = []
    for layer, pair in enumerate(chunk):
        if len(pair) != 2:
            raise ValueError(f"layer {layer}: expected a (keys, values) pair")
        for t in pair:
            # no-ops for the documented input (contiguous CPU tensors); a safety net otherwise
            tensors.append(t.detach().to("cpu").contiguous())
    dtype = tensors[0].dtype
    if any(t.dtype != dtype for t in tensors):
        raise ValueError("all tensors of a chunk must share one dtype")
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"unsupported dtype {dtype}; supported: {sorted(DTYPES)}")
    header = {
        "key": key,
        "dtype": DTYPE_NAMES[dtype],
        "n_layers": len(chunk),
        "shapes": [list(t.shape) for t in tensors],
        "byteorder": sys.byteorder,
        **({"meta": meta} if meta is not None else {}),
    }
    return frame(header, [raw_bytes(t) for t in tensors], FORMAT_VERSION)


def frame(header: dict[str, Any], payload: list[bytes | memoryview], version: int) -> bytes:
    """magic, `version`, the JSON `header` padded so the payload starts 64-byte aligned, the
    payload parts, and the checksum of everything before it (the layout in this module's docstring)."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    # JSON whitespace as padding: a reader that takes over its buffer (decode of a bytearray) can
    # then view tensors in place
    raw += b" " * (-(_PREFIX.size + len(raw)) % PAYLOAD_ALIGN)
    parts: list[bytes | memoryview] = [_PREFIX.pack(MAGIC, version, len(raw)), raw, *payload]
    parts.append(_digest(parts))
    return b"".join(parts)


def unframe(data: bytes | bytearray, key: str, version: int, verify: bool = True) -> tuple[dict[str, Any], int, int]:
    """Verify the framing of `data` made by `frame(header, ..., version)` for `key`: (header,
    payload start, payload end). Raises CorruptChunk for a short, truncated, damaged or misfiled
    chunk and for another version; the header must name `key`. `verify=False` skips only the
    checksum (bytes that never left this process)."""
    view = memoryview(data)
    n = len(view)
    if n < _PREFIX.size + _DIGEST_SIZE:
        raise CorruptChunk(f"chunk {key!r}: {n} bytes is shorter than the fixed framing")
    magic, got, header_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise CorruptChunk(f"chunk {key!r}: bad magic {bytes(magic)!r}")
    if got != version:
        raise CorruptChunk(f"chunk {key!r}: format version {got}, this reader takes {version}")
    start = _PREFIX.size + header_len
    if header_len > _MAX_HEADER or start + _DIGEST_SIZE > n:
        raise CorruptChunk(f"chunk {key!r}: header length {header_len} does not fit in {n} bytes")
    end = n - _DIGEST_SIZE
    if verify and _digest([view[:end]]) != bytes(view[end:]):
        raise CorruptChunk(f"chunk {key!r}: checksum mismatch (torn write or damaged bytes)")
    try:
        header = json.loads(bytes(view[_PREFIX.size : start]))
        if not isinstance(header, dict):
            raise TypeError("header is not an object")
    except (ValueError, TypeError) as e:  # JSONDecodeError/UnicodeDecodeError are ValueErrors
        raise CorruptChunk(f"chunk {key!r}: unreadable header ({e})") from None
    if header.get("key") != key:
        raise CorruptChunk(f"chunk {key!r}: holds the data of key {header.get('key')!r} (misfiled)")
    return header, start, end


def decode_chunk(data: bytes | bytearray, key: str) -> KVChunk:
    """Parse and verify bytes made by `encode_chunk(chunk, key)`; raise CorruptChunk otherwise.

    The returned tensors are writable and share no memory with immutable `data` (bytes): the
    payload is copied once. A bytearray is taken over instead (the tensors view it, no copy):
    the caller hands it on and must not change it afterwards — DiskTier.get reads files into
    fresh bytearrays for exactly this.
    """
    return decode_chunk_meta(data, key)[0]


def decode_chunk_meta(data: bytes | bytearray, key: str) -> tuple[KVChunk, dict[str, Any] | None]:
    """`decode_chunk`, plus the `meta` object the chunk was encoded with (None if none)."""
    header, start, end = unframe(data, key, FORMAT_VERSION)
    try:
        dtype_name = header["dtype"]
        n_layers = int(header["n_layers"])
        shapes = [tuple(int(d) for d in s) for s in header["shapes"]]
        byteorder = header["byteorder"]
        meta = header.get("meta")
        if meta is not None and not isinstance(meta, dict):
            raise TypeError("meta is not an object")
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptChunk(f"chunk {key!r}: unreadable header ({e})") from None
    if dtype_name not in DTYPES:
        raise CorruptChunk(f"chunk {key!r}: unknown dtype {dtype_name!r}")
    if byteorder != sys.byteorder:
        raise CorruptChunk(f"chunk {key!r}: written on a {byteorder}-endian machine")
    if n_layers < 1 or len(shapes) != 2 * n_layers or any(d < 0 for s in shapes for d in s):
        raise CorruptChunk(f"chunk {key!r}: inconsistent header (n_layers={n_layers}, {len(shapes)} shapes)")
    dtype = DTYPES[dtype_name]
    itemsize = torch.empty((), dtype=dtype).element_size()
    counts = [math.prod(s) for s in shapes]
    if sum(counts) * itemsize != end - start:
        raise CorruptChunk(f"chunk {key!r}: payload of {end - start} bytes, header says {sum(counts) * itemsize}")

    # bytes: the one copy (writable, independent of `data`); a bytearray: taken over as it is
    own = isinstance(data, bytearray) and start % PAYLOAD_ALIGN == 0
    buf = data if own else bytearray(memoryview(data)[start:end])
    base = start if own else 0
    tensors: list[torch.Tensor] = []
    offset = 0
    for shape, count in zip(shapes, counts):
        if count:
            t = torch.frombuffer(buf, dtype=dtype, count=count, offset=base + offset).view(shape)
        else:  # frombuffer rejects count=0
            t = torch.empty(shape, dtype=dtype)
        tensors.append(t)
        offset += count * itemsize
    return [(tensors[2 * i], tensors[2 * i + 1]) for i in range(n_layers)], meta
