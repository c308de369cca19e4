"""LayerCodec: a chunk as one tensor per layer (an engine's own paged-KV slices), stored raw or
quantized (kvgate.index.kv.chunks.quant), optionally entropy-coded with zstd.

The framing is codec.py's (magic, version, JSON header, payload, XXH3-128 over all of it, the key
inside), with its own format version, so a chunk of one kind never decodes as the other. Header:
{"key", "codec", "entropy", "dtype", "layers", "shape" (one layer's), "group" (of the codec
applied), "byteorder"}. Payload, all layers stacked: raw → the tensors' bytes; int8 → q, then the
scales (in the KV's 16-bit dtype, float16 for float32 KV); int4 → the packed nibbles, then the scales; with entropy "zstd" the whole payload
is one zstd frame. Stacking lets one operation quantize or dequantize every layer.

Invariants: `decode` raises CorruptChunk (never returns data) for anything `encode` did not make
under the same key; the codec named in the header is the one applied, so readers configured with
another codec still read every chunk correctly; `LayerChunk.tensors(device)` returns tensors of
the stored shape and dtype, dequantized on `device` (a GPU loader moves the compact integers and
expands them there).
"""

from __future__ import annotations

import math
import sys
import warnings
from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from kvgate.index.kv.chunks.codec import DTYPE_NAMES, DTYPES, PAYLOAD_ALIGN, CorruptChunk, frame, raw_bytes, unframe
from kvgate.index.kv.chunks.quant import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8, scale_dtype

LAYER_FORMAT_VERSION = 4
CODECS = ("raw", "int8", "int4")
GROUPS = {"int8": 32, "int4": 32}  # values per scale
ENTROPY = ("none", "zstd")
_MAX_RAW = 1 << 31  # bound on a decompressed payload: a corrupt frame cannot make us allocate more


@dataclass
class LayerChunk:
    """A decoded chunk: the stored parts of all layers at once (CPU tensors viewing one buffer):
    raw → (x,) of shape [layers, *shape]; int8/int4 → (q, scale)."""

    codec: str
    dtype: torch.dtype
    layers: int
    shape: tuple[int, ...]  # one layer's
    parts: tuple[torch.Tensor, ...]
    group: int
    nbytes: int  # encoded size

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [self.shape] * self.layers

    def tensors(self, device: torch.device | str = "cpu") -> list[torch.Tensor]:
        """The layers' tensors on `device`, dequantized there (one operation for all layers)."""
        return list(self.expand([p.to(device, non_blocking=True) for p in self.parts]).unbind(0))

    def expand(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """All layers at once, [layers, *shape], from this chunk's `parts` wherever they are (a
        loader moves them to the device first, so the integers, not the floats, cross the bus)."""
        if self.codec == "raw":
            return parts[0]
        if self.codec == "int8":
            return dequantize_int8(parts[0], parts[1], self.dtype, self.group)
        return dequantize_int4(parts[0], parts[1], self.dtype, self.group)


def _part_shapes(
    codec: str, shape: tuple[int, ...], group: int, scale: torch.dtype
) -> list[tuple[tuple[int, ...], torch.dtype | None]]:
    """(shape, dtype) of each stored part (all layers stacked first); dtype None = the chunk's own."""
    head, c = shape[:-1], shape[-1]
    if codec == "raw":
        return [(shape, None)]
    if codec == "int8":
        return [(shape, torch.int8), ((*head, c // group), scale)]
    return [((*head, c // 2), torch.uint8), ((*head, c // group), scale)]


class LayerCodec:
    """encode/decode of per-layer tensor lists (the ChunkStore codec of the vLLM connector)."""

    def __init__(
        self,
        codec: Literal["raw", "int8", "int4"] = "int8",
        entropy: Literal["none", "zstd"] = "none",
        *,
        zstd_level: int = 1,
    ) -> None:
        """Groups (values per scale) are 32 values for both; layers whose last dimension
        a group does not divide are stored raw (exact), never wrongly shaped."""
        if codec not in CODECS:
            raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
        if entropy not in ENTROPY:
            raise ValueError(f"entropy must be one of {ENTROPY}, got {entropy!r}")
        self.codec, self.entropy, self.zstd_level = codec, entropy, zstd_level

    @property
    def name(self) -> str:
        return self.codec + ("+zstd" if self.entropy == "zstd" else "")

    def encode(self, layers: Sequence[torch.Tensor], key: str) -> bytes:
        """Serialize CPU tensors (one per layer, one shape, one float dtype) under `key`."""
        if not layers:
            raise ValueError("a chunk needs at least one layer")
        dtype, shape = layers[0].dtype, tuple(layers[0].shape)
        if dtype not in DTYPE_NAMES or any(t.dtype != dtype or tuple(t.shape) != shape for t in layers) or not shape:
            raise ValueError(f"layers must share one shape and one of {sorted(DTYPES)}")
        codec, group = self.codec, GROUPS.get(self.codec, 0)
        if group and shape[-1] % group:
            codec, group = "raw", 0
        whole = torch.stack([t.detach() for t in layers])
        if codec == "raw":
            payload = [raw_bytes(whole)]
        else:
            q, sc = quantize_int8(whole, group) if codec == "int8" else quantize_int4(whole, group)
            payload = [raw_bytes(q.contiguous()), raw_bytes(sc.contiguous())]
        if self.entropy == "zstd":
            import zstandard

            payload = [memoryview(zstandard.ZstdCompressor(level=self.zstd_level).compress(b"".join(payload)))]
        header = {
            "key": key,
            "codec": codec,
            "entropy": self.entropy,
            "dtype": DTYPE_NAMES[dtype],
            "layers": len(layers),
            "shape": list(shape),
            "group": group,
            "byteorder": sys.byteorder,
        }
        return frame(header, payload, LAYER_FORMAT_VERSION)

    def decode(self, data: bytes | bytearray, key: str, verify: bool = True) -> LayerChunk:
        """Verify and parse; a bytearray is taken over (the tensors view it: the caller must not
        change it afterwards; DiskTier.get returns fresh ones), bytes are copied once. With
        `verify=False` (bytes this process encoded and kept: the RAM tier) the checksum is skipped
        and bytes are viewed, not copied: the parts are then read-only, as the loader uses them."""
        header, start, end = unframe(data, key, LAYER_FORMAT_VERSION, verify)
        try:
            codec, entropy, group = header["codec"], header["entropy"], int(header["group"])
            dtype = DTYPES[header["dtype"]]
            layers = int(header["layers"])
            shape = tuple(int(d) for d in header["shape"])
            byteorder = header["byteorder"]
        except (KeyError, ValueError, TypeError) as e:
            raise CorruptChunk(f"chunk {key!r}: unreadable header ({e})") from None
        if (
            codec not in CODECS
            or entropy not in ENTROPY
            or byteorder != sys.byteorder
            or (codec != "raw" and (group < 2 or group % 2))
        ):
            raise CorruptChunk(f"chunk {key!r}: unsupported codec {codec!r}/{entropy!r} (group {group}, {byteorder})")
        if layers < 1 or not shape or any(d < 0 for d in shape) or (codec != "raw" and shape[-1] % group):
            raise CorruptChunk(f"chunk {key!r}: inconsistent shape {shape} x {layers}")
        scale = scale_dtype(dtype)
        parts_layout = [((layers, *shp), dt or dtype) for shp, dt in _part_shapes(codec, shape, group, scale)]
        sizes = [math.prod(shp) * dt.itemsize for shp, dt in parts_layout]
        buf, base = self._payload(data, key, start, end, entropy, sum(sizes), copy=verify)
        parts, offset = [], base
        for (shp, dt), n in zip(parts_layout, sizes):
            count = n // dt.itemsize
            t = _view(buf, dt, count, offset) if count else torch.empty(0, dtype=dt)
            parts.append(t.view(shp))
            offset += n
        return LayerChunk(codec, dtype, layers, shape, tuple(parts), group, len(data))

    @staticmethod
    def _payload(
        data: bytes | bytearray, key: str, start: int, end: int, entropy: str, total: int, copy: bool = True
    ) -> tuple[bytes | bytearray, int]:
        """A buffer holding exactly `total` payload bytes, and where they start in it: writable,
        unless `copy` is False and `data` is bytes (then `data` itself, read-only)."""
        if entropy == "zstd":
            import zstandard

            if total > _MAX_RAW:
                raise CorruptChunk(f"chunk {key!r}: header claims {total} bytes")
            try:
                raw = zstandard.ZstdDecompressor().decompress(memoryview(data)[start:end], max_output_size=total)
            except zstandard.ZstdError as e:
                raise CorruptChunk(f"chunk {key!r}: zstd frame unreadable ({e})") from None
            buf, base, n = bytearray(raw), 0, len(raw)
        elif (isinstance(data, bytearray) or not copy) and start % PAYLOAD_ALIGN == 0:
            buf, base, n = data, start, end - start
        else:
            buf, base, n = bytearray(memoryview(data)[start:end]), 0, end - start
        if n != total:
            raise CorruptChunk(f"chunk {key!r}: payload of {n} bytes, header says {total}")
        return buf, base


def _view(buf: bytes | bytearray, dtype: torch.dtype, count: int, offset: int) -> torch.Tensor:
    """`count` values of `buf` from byte `offset`, without a copy. torch warns once that a view
    of bytes is not write-protected; the RAM tier's parts are only read."""
    if isinstance(buf, bytearray):
        return torch.frombuffer(buf, dtype=dtype, count=count, offset=offset)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return torch.frombuffer(buf, dtype=dtype, count=count, offset=offset)
