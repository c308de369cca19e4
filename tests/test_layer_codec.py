"""LayerCodec and the quantizers: the connector's chunk format (raw, int8, int4, zstd)."""

from __future__ import annotations

import pytest
import torch

from kvgate.index.kv.chunks import ChunkStore, CorruptChunk, DiskTier, MemoryTier
from kvgate.index.kv.chunks.layer_codec import LayerCodec
from kvgate.index.kv.chunks.quant import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8


def _layers(n: int = 3, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # keys with an outlier channel, values small: the ranges a real KV cache shows
    out = []
    for _ in range(n):
        t = torch.randn(2, 3, 16, 128, generator=g)
        t[..., 5] *= 20
        t[..., 64:] *= 0.1
        out.append(t.to(dtype))
    return out


@pytest.mark.parametrize("codec,bound", [("raw", 0.0), ("int8", 1 / 254), ("int4", 1 / 14)])
@pytest.mark.parametrize("entropy", ["none", "zstd"])
def test_roundtrip_within_half_a_step(codec: str, bound: float, entropy: str) -> None:
    layers = _layers()
    c = LayerCodec(codec, entropy)  # type: ignore[arg-type]
    data = c.encode(layers, "kv:ns:00")
    got = c.decode(data, "kv:ns:00").tensors()
    for x, y in zip(layers, got):
        assert y.shape == x.shape and y.dtype == x.dtype
        group = {"raw": 128, "int8": 32, "int4": 32}[codec]
        absmax = x.float().reshape(*x.shape[:-1], -1, group).abs().amax(-1, keepdim=True)
        err = (x.float() - y.float()).reshape(*x.shape[:-1], -1, group).abs()
        # half a step, plus bf16 rounding of the result and float16 rounding of the scale
        assert bool((err <= absmax * (bound * 1.02) + absmax * 2**-8 + 1e-6).all())
    if codec == "raw":
        assert all(torch.equal(x, y) for x, y in zip(layers, got))


def test_sizes_against_raw() -> None:
    layers = _layers()
    raw = len(LayerCodec("raw").encode(layers, "k"))
    assert len(LayerCodec("int8").encode(layers, "k")) / raw < 0.55
    assert len(LayerCodec("int4").encode(layers, "k")) / raw < 0.30


def test_reader_uses_the_codec_in_the_chunk() -> None:
    layers = _layers()
    data = LayerCodec("int4").encode(layers, "k")
    chunk = LayerCodec("raw").decode(data, "k")
    assert chunk.codec == "int4" and chunk.tensors()[0].shape == layers[0].shape


def test_head_size_a_group_does_not_divide_is_stored_exactly() -> None:
    x = [torch.randn(1, 2, 4, 40).to(torch.float16)]
    chunk = LayerCodec("int8").decode(LayerCodec("int8").encode(x, "k"), "k")
    assert chunk.codec == "raw" and torch.equal(chunk.tensors()[0], x[0])


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend", "misfile"])
def test_damage_is_refused(damage: str) -> None:
    data = bytearray(LayerCodec("int8", "zstd").encode(_layers(), "kv:a"))
    key = "kv:a"
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        data = data[:-100]
    elif damage == "extend":
        data += b"\0"
    else:
        key = "kv:b"
    with pytest.raises(CorruptChunk):
        LayerCodec().decode(bytes(data), key)


def test_quantizers_reject_bad_groups() -> None:
    with pytest.raises(ValueError, match="group"):
        quantize_int4(torch.zeros(2, 10), 4)
    q, s = quantize_int8(torch.zeros(1, 64))
    assert torch.equal(dequantize_int8(q, s, torch.float32), torch.zeros(1, 64))
    p, s4 = quantize_int4(torch.zeros(1, 64))
    assert torch.equal(dequantize_int4(p, s4, torch.float32), torch.zeros(1, 64))


def test_store_with_layer_codec_drops_a_corrupt_chunk(tmp_path) -> None:
    store = ChunkStore([MemoryTier(1 << 26), DiskTier(tmp_path / "kv", 1 << 28)], "m:bf16:128", LayerCodec("int8"))
    store.put_many([1, 2], [_layers(seed=1), _layers(seed=2)])
    got = store.get_many([1, 2])
    assert len(got) == 2 and got[0].codec == "int8"
    disk = store.tiers[1]
    store.tiers[0].clear()
    key = store.key(2)
    disk.put(key + "x", b"")  # unrelated key
    disk.delete(key)
    disk.put(key, b"KVGC" + b"\0" * 40)
    assert len(store.get_many([1, 2])) == 1
    assert store.stats()["corrupt"] == 1
