"""KV chunk store: codec, tiers, ChunkStore, multi-process sharing, crash and corruption safety.

Chunk contents are derived from the chunk hash (`det_chunk`), so another process (or the test
after a crash) can recompute exactly what must have been written under a key.
"""

from __future__ import annotations

import errno
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import diskcache
import pytest
import torch

from kvgate.index.kv.chunks import (
    ChunkStore,
    CorruptChunk,
    DiskTier,
    KVChunk,
    MemoryTier,
    StorageTier,
    chunk_hashes,
    decode_chunk,
    encode_chunk,
)
from kvgate.index.kv.hashing import block_hashes

TESTS = Path(__file__).resolve().parent
NS = "tiny-model:float32"


def det_chunk(
    h: int, layers: int = 2, heads: int = 2, tokens: int = 4, dim: int = 8, dtype: torch.dtype = torch.float32
) -> KVChunk:
    """A chunk whose every value depends on (h, layer, k/v, position): cheap, exact to recompute."""
    n = heads * tokens * dim
    base = float(h % 100_003)
    out: KVChunk = []
    for layer in range(layers):
        k = (torch.arange(n, dtype=torch.float32) + base + 1000 * layer).reshape(heads, tokens, dim)
        out.append((k.to(dtype), (-k).to(dtype)))
    return out


def same_chunk(a: KVChunk, b: KVChunk) -> bool:
    """Bit-exact equality (NaN-safe: compares raw bytes), same dtype and shapes."""
    if len(a) != len(b):
        return False
    for pa, pb in zip(a, b):
        for x, y in zip(pa, pb):
            if x.dtype != y.dtype or x.shape != y.shape:
                return False
            if not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
                return False
    return True


def run_py(code: str) -> subprocess.Popen[str]:
    """A child Python in this venv that can import the test helpers."""
    return subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(TESTS)!r})\n{code}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# ---------------------------------------------------------------- codec


ODD_SHAPES = [[(3, 7, 5), (3, 7, 5)], [(1, 1, 1), (1, 1, 1)], [(2, 0, 4), (2, 0, 4)], [(5, 3, 2), (5, 3, 2)]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_codec_roundtrip_dtypes_and_odd_shapes(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(7)
    chunk: KVChunk = [tuple(torch.randn(s, generator=g).to(dtype) for s in pair) for pair in ODD_SHAPES]  # type: ignore[misc]
    chunk[0][0].view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -0.0]).to(dtype)
    data = encode_chunk(chunk, "kv:x:0001")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. torch's warning about non-writable buffers
        out = decode_chunk(data, "kv:x:0001")
    assert same_chunk(chunk, out)
    assert all(t.is_contiguous() for pair in out for t in pair)
    # writable and independent: no read-only warning, original and bytes untouched
    before = bytes(data)
    out[1][0].add_(1)
    assert data == before and same_chunk(chunk, decode_chunk(data, "kv:x:0001"))


def test_codec_smollm_sized_chunk() -> None:
    chunk = det_chunk(99, layers=30, heads=3, tokens=256, dim=64)
    data = encode_chunk(chunk, "k")
    assert len(data) - 2 * 30 * 3 * 256 * 64 * 4 < 4096  # framing is small
    assert same_chunk(chunk, decode_chunk(data, "k"))


def test_codec_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        encode_chunk([], "k")
    with pytest.raises(ValueError, match="dtype"):
        encode_chunk([(torch.zeros(1, 2, 2), torch.zeros(1, 2, 2, dtype=torch.float16))], "k")
    with pytest.raises(ValueError, match="unsupported"):
        encode_chunk([(torch.zeros(1, 2, 2, dtype=torch.int64),) * 2], "k")
    # non-contiguous input is accepted and stored in logical order
    t = torch.arange(24.0).reshape(2, 3, 4).transpose(1, 2)
    assert torch.equal(decode_chunk(encode_chunk([(t, t)], "k"), "k")[0][0], t)


def _flip(data: bytes, pos: int) -> bytes:
    b = bytearray(data)
    b[pos] ^= 0x40
    return bytes(b)


def test_corrupt_chunk_cases() -> None:
    assert issubclass(CorruptChunk, ValueError)
    data = encode_chunk(det_chunk(1), "kv:a")
    header_len = int.from_bytes(data[6:10], "little")
    payload_at = 10 + header_len
    cases = {
        "empty": b"",
        "bad magic": b"XXXX" + data[4:],
        "bad version": data[:4] + (99).to_bytes(2, "little") + data[6:],
        "huge header length": data[:6] + (2**31).to_bytes(4, "little") + data[10:],
        "truncated in header": data[: payload_at - 3],
        "truncated in payload": data[: payload_at + 5],
        "missing last byte": data[:-1],
        "trailing byte": data + b"\0",
        "flipped payload byte": _flip(data, payload_at + 17),
        "flipped header byte": _flip(data, 12),
        "flipped checksum byte": _flip(data, len(data) - 1),
    }
    for bad in cases.values():
        with pytest.raises(CorruptChunk, match="kv:a"):
            decode_chunk(bad, "kv:a")
    with pytest.raises(CorruptChunk, match="misfiled"):
        decode_chunk(data, "kv:b")


# ---------------------------------------------------------------- tiers


def test_memory_tier_lru_under_byte_budget() -> None:
    tier = MemoryTier(1000)
    assert isinstance(tier, StorageTier)
    assert tier.put("a", b"a" * 400) and tier.put("b", b"b" * 400)
    assert tier.get("a") == b"a" * 400  # a is now most recent
    assert tier.put("c", b"c" * 400)  # evicts b, the least recently used
    assert not tier.contains("b") and tier.contains("a") and tier.contains("c")
    assert tier.put("a", b"a" * 400)  # present: kept, no double charge
    s = tier.stats()
    assert (s["items"], s["bytes"], s["budget_bytes"], s["evictions"]) == (2, 800, 1000, 1)
    assert tier.put("d", b"d" * 900)  # needs both out
    assert sorted(tier.keys()) == ["d"] and tier.stats()["evictions"] == 3
    assert tier.put("e", b"e" * 1001) is False and tier.contains("d")  # oversize: refused, no harm
    assert tier.get("nope") is None
    tier.delete("d")
    assert tier.stats()["bytes"] == 0
    tier.put("x", b"x")
    tier.clear()
    assert tier.stats()["items"] == 0


def test_disk_tier_budget_lru_persistence_and_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tier = DiskTier(tmp_path / "d", 1_000_000)
    assert isinstance(tier, StorageTier)
    val = {k: bytes([i]) * 200_000 for i, k in enumerate("abcdefg")}
    for k in "abcd":
        assert tier.put(k, val[k])
    assert tier.get("a") == val["a"]  # touch a: b is now the oldest
    assert tier.put("e", val["e"]) and tier.put("f", val["f"])
    assert sorted(tier.keys()) == ["a", "d", "e", "f"]
    s = tier.stats()
    assert s["evictions"] == 2 and s["items"] == 4 and s["bytes"] <= s["budget_bytes"] == 1_000_000
    # oversize: refused without touching what is stored
    assert tier.put("big", b"x" * 1_000_001) is False and tier.stats()["rejected"] == 1 and tier.stats()["items"] == 4

    # disk full while writing the value file: False, counted, nothing stored
    def full(*a: object, **k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tier._cache, "add", full)
    assert tier.put("g", val["g"]) is False and tier.stats()["write_errors"] == 1
    monkeypatch.undo()
    assert not tier.contains("g")
    tier.delete("a")
    tier.close()
    again = DiskTier(tmp_path / "d", 1_000_000)  # reopen: contents survive
    assert sorted(again.keys()) == ["d", "e", "f"] and again.get("f") == val["f"]
    again.clear()
    assert again.stats()["items"] == 0 and again.get("f") is None
    again.close()


# ---------------------------------------------------------------- store


def make_store(tmp_path: Path, mem: int = 10**7, disk: int = 10**8, ns: str = NS) -> ChunkStore:
    return ChunkStore([MemoryTier(mem), DiskTier(tmp_path / "kv", disk)], ns)


def test_chunk_hashes_is_block_hashes() -> None:
    toks = list(range(1000))
    assert chunk_hashes(toks, 256, ("m", 1)) == block_hashes(toks, 256, extra=("m", 1))
    assert len(chunk_hashes(toks)) == 3  # the partial tail (1000 = 3·256 + 232) is not hashed
    assert chunk_hashes(toks, 256, ("a",)) != chunk_hashes(toks, 256, ("b",))


def test_store_across_tiers_promotion_and_gap(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    hs = chunk_hashes(list(range(5 * 16)), 16)
    chunks = [det_chunk(h) for h in hs]
    assert store.longest_prefix(hs) == 0 and store.get_many(hs) == []
    # chain with a gap: chunk 2 never stored
    assert store.put_many(hs[:2] + hs[3:], chunks[:2] + chunks[3:]) == 4
    assert store.longest_prefix(hs) == 2
    got = store.get_many(hs)
    assert len(got) == 2 and all(same_chunk(a, b) for a, b in zip(got, chunks))
    assert store.stats()["hits"] == {"memory": 2, "disk": 0}
    # fill the gap; already-present chunks are skipped
    assert store.put_many(hs, chunks) == 1
    assert store.longest_prefix(hs) == 5
    # cold memory: reads come from disk and are promoted
    store.clear("memory")
    assert store.longest_prefix(hs) == 5  # disk alone still has them all
    got = store.get_many(hs)
    assert len(got) == 5 and all(same_chunk(a, b) for a, b in zip(got, chunks))
    s = store.stats()
    assert s["hits"] == {"memory": 2, "disk": 5} and s["promotions"] == 5
    # per tier: a tier is asked only after the faster ones missed; promotions count as writes
    assert s["queries"] == {"memory": 9, "disk": 7} and s["writes"] == {"memory": 10, "disk": 5}
    assert s["tiers"]["memory"]["items"] == 5
    store.get_many(hs)
    assert store.stats()["hits"]["memory"] == 7
    # a chunk only on disk gets rewritten to memory by put_many but is not new to the store
    store.tiers[0].delete(store.key(hs[4]))
    assert store.put_many(hs, chunks) == 0 and store.tiers[0].contains(store.key(hs[4]))
    assert store.stored_hashes() == sorted(hs)
    # namespaces do not see each other's chunks, even in shared tiers
    other = ChunkStore(store.tiers, "other-model:float16")
    assert other.longest_prefix(hs) == 0 and other.stored_hashes() == []
    with pytest.raises(ValueError):
        store.put_many(hs, chunks[:1])
    with pytest.raises(ValueError):
        store.clear("nope")
    store.close()


def test_store_tier_refusal_is_not_an_error(tmp_path: Path) -> None:
    chunk = det_chunk(5, layers=4, heads=4, tokens=64, dim=16)  # ~130 KB encoded
    store = ChunkStore([MemoryTier(10_000), DiskTier(tmp_path / "kv", 10**7)], NS)
    assert store.put_many([5], [chunk]) == 1  # memory refused (too big), disk took it
    s = store.stats()
    assert s["put_failures"] == 1 and s["puts"] == 1 and s["tiers"]["memory"]["rejected"] == 1
    assert len(store.get_many([5])) == 1  # served from disk; promotion refused quietly
    store.close()


def test_store_rejects_misfiled_bytes(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    hs = [11, 12, 13]
    store.put_many(hs[:1], [det_chunk(11)])
    # bytes of a different key filed under chunk 12 (valid checksum, wrong key)
    store.tiers[0].put(store.key(12), encode_chunk(det_chunk(99), store.key(99)))
    store.put_many([13], [det_chunk(13)])
    assert store.longest_prefix(hs) == 3
    assert len(store.get_many(hs)) == 1
    assert store.stats()["corrupt"] == 1 and store.longest_prefix(hs) == 1
    store.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_disk_corruption_is_detected_deleted_and_repaired(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store(tmp_path)
    hs = list(range(100, 104))
    chunks = [det_chunk(h) for h in hs]
    store.put_many(hs, chunks)
    store.clear("memory")
    with diskcache.Cache(str(tmp_path / "kv")) as raw:
        handle = raw.get(store.key(hs[2]), read=True)
        path = Path(handle.name)
        handle.close()
    data = path.read_bytes()
    if damage == "flip":
        path.write_bytes(_flip(data, len(data) // 2))
    elif damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.unlink()
    with caplog.at_level("WARNING", logger="kvgate.chunks"):
        got = store.get_many(hs)
    assert len(got) == 2 and all(same_chunk(a, b) for a, b in zip(got, chunks))
    assert "corrupt KV chunk" in caplog.text
    s = store.stats()
    assert s["corrupt"] == 1 and s["hits"]["disk"] == 2 and s["corrupt_by_tier"] == {"memory": 0, "disk": 1}
    key = store.key(hs[2])
    assert not any(t.contains(key) for t in store.tiers)  # deleted everywhere
    assert store.longest_prefix(hs) == 2
    assert store.put_many(hs, chunks) == 1  # the next put repairs it
    store.clear("memory")
    got = store.get_many(hs)
    assert len(got) == 4 and all(same_chunk(a, b) for a, b in zip(got, chunks))
    store.close()


def test_disk_read_many_reads_in_order_up_to_the_first_missing(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path / "kv", 1 << 30)
    try:
        for k in ("a", "b", "d"):
            assert tier.put(k, k.encode() * 1000)
        assert tier.read_many(["a", "b", "d"]) == [b"a" * 1000, b"b" * 1000, b"d" * 1000]
        assert tier.read_many(["a", "b", "c", "d"]) == [b"a" * 1000, b"b" * 1000]  # stops at c
        assert tier.read_many(["c"]) == [] and tier.read_many([]) == []
    finally:
        tier.close()


def test_the_ram_tier_is_read_without_a_copy_or_checksum_but_still_by_key() -> None:
    from kvgate.index.kv.chunks.layer_codec import LayerCodec

    codec = LayerCodec("raw")
    data = codec.encode([torch.randn(2, 4, 8).to(torch.bfloat16) for _ in range(3)], "k1")
    chunk = codec.decode(data, "k1", verify=False)
    # a view into the bytes object (CPython keeps its bytes inside the object), not a copy
    assert id(data) < chunk.parts[0].data_ptr() < id(data) + len(data) + 64
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF  # the checksum itself: only a verifying read notices
    codec.decode(bytes(damaged), "k1", verify=False)
    with pytest.raises(CorruptChunk):
        codec.decode(bytes(damaged), "k1")
    with pytest.raises(CorruptChunk, match="misfiled"):
        codec.decode(data, "k2", verify=False)


# ---------------------------------------------------------------- processes


def test_two_processes_share_one_disk_tier(tmp_path: Path) -> None:
    """The child writes chunks A and reads the parent's chunks B through its own open store."""
    d = tmp_path / "shared"
    a_hashes, b_hashes = [1, 2, 3], [4, 5, 6]
    parent = ChunkStore([DiskTier(d, 10**8)], NS)  # opened before the child writes
    child = run_py(f"""
from test_chunks import det_chunk, same_chunk
from kvgate.index.kv.chunks import ChunkStore, DiskTier
store = ChunkStore([DiskTier({str(d)!r}, 10**8)], {NS!r})
assert store.put_many({a_hashes}, [det_chunk(h) for h in {a_hashes}]) == 3
print("written", flush=True)
sys.stdin.readline()
got = store.get_many({b_hashes})
assert len(got) == 3 and all(same_chunk(c, det_chunk(h)) for c, h in zip(got, {b_hashes}))
print("ok", flush=True)
""")
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "written", child.stderr.read() if child.stderr else ""
        got = parent.get_many(a_hashes)
        assert len(got) == 3 and all(same_chunk(c, det_chunk(h)) for c, h in zip(got, a_hashes))
        assert parent.put_many(a_hashes + b_hashes, [det_chunk(h) for h in a_hashes + b_hashes]) == 3
        child.stdin.write("go\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0 and out.strip() == "ok", err
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    parent.close()


def test_writer_killed_mid_write_leaves_no_bad_chunk(tmp_path: Path) -> None:
    """SIGKILL a process writing ~4 MB chunks in a loop (with eviction running: the budget holds
    about 10); every key left on disk must decode to exactly what was written under it."""
    d = tmp_path / "crash"
    budget = 48 * 2**20
    shape = dict(layers=8, heads=4, tokens=256, dim=64)  # 4 MiB of float32 per chunk
    writer = run_py(f"""
from test_chunks import det_chunk
from kvgate.index.kv.chunks import ChunkStore, DiskTier
store = ChunkStore([DiskTier({str(d)!r}, {budget})], {NS!r})
print("ready", flush=True)
i = 0
while True:
    h = (i * 0x9E3779B97F4A7C15 + 1) % 2**64
    store.put_many([h], [det_chunk(h, **{shape!r})])
    i += 1
""")
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready", writer.stderr.read() if writer.stderr else ""
        time.sleep(1.0)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert writer.returncode == -signal.SIGKILL
    tier = DiskTier(d, budget)
    store = ChunkStore([tier], NS)
    keys = list(tier.keys())
    assert keys, "the writer stored nothing in 1 s"
    prefix = f"kv:{NS}:"
    for key in keys:
        h = int(key[len(prefix) :], 16)
        chunk = decode_chunk(tier.get(key) or b"", key)  # raises if torn or dangling
        assert same_chunk(chunk, det_chunk(h, **shape)), key  # type: ignore[arg-type]
        assert len(store.get_many([h])) == 1
    assert store.stats()["corrupt"] == 0
    assert tier.stats()["bytes"] <= budget + 4 * 2**20 + 2**16  # at most one put past budget
    tier.close()
