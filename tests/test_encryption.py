"""Encryption at rest (kvgate.index.storage.cipher; docs/encryption.md): the derivations and ciphers,
the response cache's entry stores (disk and a real Redis), the KV chunk store's tiers, the vLLM
connector's chunk path on CPU tensors, and the proxy end to end. The EntryStore contract runs
against encrypted stores too (tests/test_entry_store.py, the "-encrypted" stores)."""

from __future__ import annotations

import base64
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from kvgate.engines.vllm.kv_connector.settings import SettingsError, build_cipher, parse
from kvgate.engines.vllm.kv_connector.step_save import copy_out
from kvgate.engines.vllm.kv_connector.worker import Counters, Loader, LoadSpec, PagedKV, Saver, SaveSpec
from kvgate.index.kv.chunks import ChunkStore, DiskTier, MemoryTier
from kvgate.index.kv.chunks.layer_codec import LayerCodec
from kvgate.index.responses.entries import CacheEntry, DiskEntryStore
from kvgate.index.responses.entries.redis import RedisEntryStore
from kvgate.index.storage.cipher import (
    AuthFailed,
    ChunkCipher,
    EntryCipher,
    chunk_key,
    derive_key,
    entry_key,
    parse_master_key,
)
from kvgate.index.storage.env import MissingSecret
from kvgate.index.storage.redis_link import LinkSettings, RedisLink
from kvgate.index.storage.sealed import seal, unseal
from kvgate.middleware.config import parse_config
from kvgate.middleware.errors import ConfigError
from kvgate.middleware.request import CacheControl, build_view
from kvgate.middleware.server.proxy import tenant_of
from tests.conftest import route_config

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))
ANSWER = "The answer nobody may read at rest"
DIM = 8


def entry(store, key: str = "exact-1", scope: str = "scope-a", content: str = ANSWER) -> CacheEntry:
    (entry_id,) = store.allocate(1)
    return CacheEntry(
        entry_id,
        scope,
        {"choices": [{"message": {"role": "assistant", "content": content}}]},
        key,
        "the secret question",
        "route",
        "model",
        time.time(),
    )


def unit() -> np.ndarray:
    return np.full(DIM, 1 / np.sqrt(DIM), dtype=np.float32)


# ---------------------------------------------------------------- derivations and ciphers
def test_master_key_is_hex_or_base64_of_32_bytes() -> None:
    assert parse_master_key(KEY.hex()) == KEY
    assert parse_master_key(base64.b64encode(KEY).decode() + "\n") == KEY
    assert parse_master_key(base64.urlsafe_b64encode(b"\xfb" * 32).decode()) == b"\xfb" * 32
    for bad in ("", "abcd", KEY[:16].hex(), "not a key at all, whatever its length may be!!"):
        with pytest.raises(ValueError, match="at least 32 random bytes") as err:
            parse_master_key(bad)
        assert bad not in str(err.value) or not bad


def test_derived_keys_are_deterministic_and_independent() -> None:
    assert entry_key(KEY, "s1") == entry_key(KEY, "s1") == derive_key(KEY, b"kvgate entries v1\0s1")
    keys = {
        entry_key(KEY, "s1"),
        entry_key(KEY, "s2"),
        entry_key(OTHER, "s1"),
        chunk_key(KEY, None),
        chunk_key(KEY, "salt-a"),
        chunk_key(KEY, "salt-b"),
        chunk_key(OTHER, "salt-a"),
        KEY,
    }
    assert len(keys) == 8 and all(len(k) == 32 for k in keys)


def test_entry_cipher_opens_only_what_it_sealed_for_that_place() -> None:
    cipher = EntryCipher(KEY)
    sealed = cipher.seal(b'{"a": 1}', "scope-a", "e:1")
    assert b'"a"' not in sealed and cipher.open(sealed, "e:1", "entries") == b'{"a": 1}'
    tampered = bytearray(sealed)
    tampered[-20] ^= 1
    for value, where in (
        (sealed, "e:2"),
        (bytes(tampered), "e:1"),
        (b'{"a": 1}', "e:1"),
        (EntryCipher(OTHER).seal(b'{"a": 1}', "scope-a", "e:1"), "e:1"),
        (sealed.replace(b"scope-a", b"scope-b"), "e:1"),
    ):
        with pytest.raises(AuthFailed):
            cipher.open(value, where, "entries")
    with pytest.raises(AuthFailed):
        cipher.open(b"junk", "e:1", None)  # a second look: not counted
    assert cipher.failures == {"entries": 5}


def test_chunk_cipher_opens_in_place_only_with_its_salt() -> None:
    cipher = ChunkCipher(KEY)
    plain = bytes(range(256)) * 100
    sealed = bytes(cipher.seal(plain, "kv:ns:1", "salt-a"))
    assert plain[:64] not in sealed and len(sealed) == len(plain) + 32
    assert cipher.open(sealed, "kv:ns:1", "salt-a") == plain  # bytes: into a new buffer
    buf = bytearray(sealed)
    assert cipher.open(buf, "kv:ns:1", "salt-a") is buf and buf == plain  # a fresh read: in place, no copy
    for key, salt in (("kv:ns:2", "salt-a"), ("kv:ns:1", "salt-b"), ("kv:ns:1", None)):
        with pytest.raises(AuthFailed):
            cipher.open(bytearray(sealed), key, salt)
    with pytest.raises(AuthFailed, match="not a sealed chunk"):
        cipher.open(plain, "kv:ns:1", "salt-a")
    assert cipher.failures == {"kv": 4}


# ---------------------------------------------------------------- entry stores
def db_bytes(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in directory.rglob("*") if p.is_file())


def test_without_a_key_the_disk_store_writes_todays_bytes(tmp_path: Path) -> None:
    store = DiskEntryStore(tmp_path / "e", DIM)
    e = entry(store)
    store.put(e, unit())
    db = sqlite3.connect(str(tmp_path / "e" / "cache.db"))
    (raw,) = db.execute("SELECT value FROM Cache WHERE key = ?", (f"e:{e.id}",)).fetchone()
    assert unseal(bytes(raw)) == e.to_bytes()
    store.close()


def test_an_encrypted_disk_store_holds_no_plaintext_and_reads_back(tmp_path: Path) -> None:
    cipher = EntryCipher(KEY)
    store = DiskEntryStore(tmp_path / "e", DIM, cipher)
    e = entry(store)
    store.put(e, unit())
    store.close()
    on_disk = db_bytes(tmp_path / "e")
    assert ANSWER.encode() not in on_disk and b"secret question" not in on_disk and unit().tobytes() not in on_disk
    again = DiskEntryStore(tmp_path / "e", DIM, EntryCipher(KEY))  # another process, the same key
    assert again.get_exact("exact-1") == e and np.array_equal(again.vector(e.id), unit())
    assert [s.entry.id for s in again.scan()] == [e.id]
    again.close()


@pytest.mark.parametrize(
    "written, read", [(None, KEY), (KEY, None), (KEY, OTHER)], ids=["plain-then-key", "key-then-off", "rotated-key"]
)
def test_entries_of_another_key_or_none_are_misses(tmp_path: Path, written: bytes | None, read: bytes | None) -> None:
    store = DiskEntryStore(tmp_path / "e", DIM, EntryCipher(written) if written else None)
    e = entry(store)
    store.put(e, unit())
    store.close()
    cipher = EntryCipher(read) if read else None
    reader = DiskEntryStore(tmp_path / "e", DIM, cipher)
    assert reader.get_exact("exact-1") is None and reader.vector(e.id) is None  # a miss, no error
    assert reader.damaged >= 1 and list(reader.scan()) == []
    if cipher is not None:
        assert cipher.failures.get("entries", 0) >= 1
    reader.close()


def test_tampered_disk_entries_are_misses_and_counted(tmp_path: Path) -> None:
    cipher = EntryCipher(KEY)
    store = DiskEntryStore(tmp_path / "e", DIM, cipher)
    a, b = entry(store, "exact-a"), entry(store, "exact-b")
    store.put(a, unit())
    store.put(b, unit())
    db = sqlite3.connect(str(tmp_path / "e" / "cache.db"))

    def stored(key: str) -> bytes:
        return bytes(db.execute("SELECT value FROM Cache WHERE key = ?", (key,)).fetchone()[0])

    # the store's layer seals what it is given again (SHA-256): only the cipher can tell these apart
    inner = bytearray(unseal(stored(f"e:{a.id}")))
    inner[-20] ^= 1
    store.cache.set(f"e:{a.id}", bytes(inner))
    store.cache.set(f"v:{b.id}", unseal(stored(f"v:{a.id}")))  # a's vector moved under b
    forged = CacheEntry(b.id, b.scope, {"choices": [{"message": {"content": "forged"}}]}, "exact-b")
    store.cache.set(f"e:{b.id}", forged.to_bytes())  # a forged answer, unencrypted
    assert store.vector(b.id) is None and store.get_exact("exact-a") is None and store.get_exact("exact-b") is None
    assert cipher.failures == {"entries": 2, "vectors": 1} and store.damaged == 2
    store.close()


def test_redis_entries_are_encrypted_and_tampering_is_a_miss(redis_server) -> None:
    cipher = EntryCipher(KEY)
    store = RedisEntryStore(RedisLink(LinkSettings(redis_server.url)), DIM, "enc:", cipher=cipher)
    e = entry(store)
    store.put(e, unit())
    store.set_marks(e.scope, [])
    r = store.link.client
    values = [v for k in r.keys("enc:*") if r.type(k) == b"hash" for v in r.hgetall(k).values()]
    assert values and not any(ANSWER.encode() in v or unit().tobytes() in v for v in values)
    assert store.get_exact("exact-1") == e and np.array_equal(store.vector(e.id), unit())
    other = RedisEntryStore(RedisLink(LinkSettings(redis_server.url)), DIM, "enc:", cipher=EntryCipher(OTHER))
    assert other.vector(e.id) is None
    inner = bytearray(unseal(r.hget(f"enc:e:{e.id}", "j")))
    inner[-20] ^= 1
    r.hset(f"enc:e:{e.id}", "j", seal(bytes(inner)))
    assert store.get_exact("exact-1") is None and store.damaged == 1 and cipher.failures == {"entries": 1}
    other.close()
    store.close()


# ---------------------------------------------------------------- KV chunk store
def chunk(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 16, 64, generator=g).to(torch.float16) for _ in range(4)]


def test_chunks_are_sealed_on_disk_not_in_memory(tmp_path: Path) -> None:
    codec, cipher = LayerCodec("raw"), ChunkCipher(KEY)
    memory, disk = MemoryTier(1 << 26), DiskTier(tmp_path / "kv", 1 << 30)
    store = ChunkStore([memory, disk], "ns", codec, cipher)
    assert store.put_many([1], [chunk(1)], salt="salt-a") == 1
    key = store.key(1)
    assert memory.get(key) == codec.encode(chunk(1), key)  # the engine's own RAM: as the codec made it
    on_disk = bytes(disk.get(key))
    assert on_disk.endswith(b"KVX1") and chunk(1)[0].numpy().tobytes()[:256] not in on_disk
    assert chunk(1)[0].numpy().tobytes()[:256] not in db_bytes(tmp_path / "kv")
    memory.clear()
    (got,) = store.get_many([1], salt="salt-a")  # from disk, opened in place, promoted to RAM in the clear
    assert all(torch.equal(a, b) for a, b in zip(got.tensors(), chunk(1)))
    assert memory.get(key) == codec.encode(chunk(1), key) and store.auth_failures == 0
    memory.clear()
    assert store.get_many([1], salt="salt-b") == []  # another tenant's salt: a miss, dropped everywhere
    assert store.auth_failures == 1 and not disk.contains(key) and store.stats()["corrupt"] == 1
    store.close()


def test_chunk_format_with_encryption_off_and_switching_it(tmp_path: Path) -> None:
    codec = LayerCodec("int8")
    plain = ChunkStore([DiskTier(tmp_path / "kv", 1 << 30)], "ns", codec)
    plain.put_many([1], [chunk(1)], salt="salt-a")
    assert bytes(plain.tiers[0].get(plain.key(1))) == codec.encode(chunk(1), plain.key(1))  # today's bytes
    plain.close()
    sealed = ChunkStore([DiskTier(tmp_path / "kv", 1 << 30)], "ns", codec, ChunkCipher(KEY))
    assert sealed.get_many([1], salt="salt-a") == [] and sealed.auth_failures == 1  # old plaintext: a miss
    sealed.put_many([2], [chunk(2)], salt="salt-a")
    sealed.close()
    off = ChunkStore([DiskTier(tmp_path / "kv", 1 << 30)], "ns", codec)
    assert off.get_many([2]) == [] and off.stats()["corrupt"] == 1  # encrypted, read without a key: a miss
    off.close()


def test_a_remote_hit_lands_sealed_on_disk_and_clear_in_memory(tmp_path: Path, redis_server) -> None:
    from kvgate.index.kv.chunks.redis import RedisTier

    codec, cipher = LayerCodec("raw"), ChunkCipher(KEY)
    remote = RedisTier(redis_server.url, prefix="enc")
    writer = ChunkStore([remote], "ns", codec, cipher)
    writer.put_many([7], [chunk(7)], salt="salt-a")
    key = writer.key(7)
    assert bytes(remote.get(key)).endswith(b"KVX1")
    memory, disk = MemoryTier(1 << 26), DiskTier(tmp_path / "kv", 1 << 30)
    reader = ChunkStore([memory, disk, RedisTier(redis_server.url, prefix="enc")], "ns", codec, ChunkCipher(KEY))
    (got,) = reader.get_many([7], salt="salt-a")
    reader.drain()
    assert torch.equal(got.tensors()[0], chunk(7)[0]) and memory.get(key) == codec.encode(chunk(7), key)
    assert bytes(disk.get(key)) == bytes(remote.get(key))  # the sealed value, as it came
    reader.close()
    writer.close()


# ---------------------------------------------------------------- the vLLM connector
def test_connector_setting_names_a_variable_never_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    disk = {"tiers": {"disk": {"path": "/tmp/kv"}}}
    assert parse(disk).encryption_key_env is None and build_cipher(parse(disk)) is None
    with pytest.raises(SettingsError, match="encryption_key: a key is never read from the config"):
        parse({**disk, "encryption_key": KEY.hex()})
    with pytest.raises(SettingsError, match="encryption_key_env: the NAME"):
        parse({**disk, "encryption_key_env": ""})
    settings = parse({**disk, "encryption_key_env": "KVGATE_TEST_MASTER"})
    monkeypatch.delenv("KVGATE_TEST_MASTER", raising=False)
    with pytest.raises(MissingSecret, match="encryption_key_env: the environment variable KVGATE_TEST_MASTER"):
        build_cipher(settings)
    monkeypatch.setenv("KVGATE_TEST_MASTER", "too short")
    with pytest.raises(SettingsError, match="KVGATE_TEST_MASTER must hold at least 32") as err:
        build_cipher(settings)
    assert "too short" not in str(err.value)
    monkeypatch.setenv("KVGATE_TEST_MASTER", KEY.hex())
    assert isinstance(build_cipher(settings), ChunkCipher)


def test_connector_chunks_load_only_with_the_requests_salt(tmp_path: Path) -> None:
    def paged(fill: str) -> PagedKV:
        return PagedKV({f"l{i}": getattr(torch, fill)(10, 2, 4, 8, dtype=torch.bfloat16) for i in range(3)})

    store = ChunkStore([DiskTier(tmp_path / "kv", 1 << 30)], "ns", LayerCodec("raw"), ChunkCipher(KEY))
    src = paged("randn")
    saver = Saver(store, 4, Counters(), lambda spec: None)
    try:
        assert saver.submit(*copy_out(src, [SaveSpec(11, [11], [3], salt="tenant-a")])[0])
        saver.drain()
    finally:
        saver.close()
    dst, counters = paged("zeros"), Counters()
    loader = Loader(store, dst, counters)
    loader.load(LoadSpec("b", [11], [[6]], skip=0, salt="tenant-b"))  # another tenant's salt
    assert loader.take_failed() == {6} and not any(d[6].any() for d in dst.layers) and store.auth_failures == 1
    saver = Saver(store, 4, Counters(), lambda spec: None)
    try:
        saver.submit(*copy_out(src, [SaveSpec(11, [11], [3], salt="tenant-a")])[0])  # recomputed and saved again
        saver.drain()
    finally:
        saver.close()
    loader.load(LoadSpec("a", [11], [[5]], skip=0, salt="tenant-a"))
    assert loader.take_failed() == set() and all(torch.equal(d[5], s[3]) for d, s in zip(dst.layers, src.layers))
    store.close()


# ---------------------------------------------------------------- the proxy, end to end
def encrypted_config(backend, cache_dir: Path, **extra) -> dict:
    raw = route_config(backend.api_base, cache_dir)
    return {**raw, "encryption": {"key_env": "KVGATE_TEST_MASTER"}, **extra}


def test_config_takes_a_variable_name_never_a_key(backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvgate.middleware.build import build_pipeline

    with pytest.raises(ConfigError, match="encryption.key: a key is never read from the config file"):
        parse_config({**route_config(backend.api_base, tmp_path), "encryption": {"key": KEY.hex()}})
    config = parse_config(encrypted_config(backend, tmp_path))
    monkeypatch.delenv("KVGATE_TEST_MASTER", raising=False)
    with pytest.raises(ConfigError, match="encryption.key_env: the environment variable KVGATE_TEST_MASTER"):
        build_pipeline(config)


@pytest.mark.parametrize("store", ["local", "redis"])
def test_proxy_serves_encrypted_hits_and_tampering_is_a_miss(
    make_proxy, backend, tmp_path: Path, store: str, monkeypatch: pytest.MonkeyPatch, request
) -> None:
    monkeypatch.setenv("KVGATE_TEST_MASTER", KEY.hex())
    extra = {}
    if store == "redis":
        extra["store"] = {"backend": "redis", "url": request.getfixturevalue("redis_server").url, "key_prefix": "p:"}
    proxy = make_proxy(raw=encrypted_config(backend, tmp_path / "cache", **extra))
    question = "What is the boiling point of water at sea level, in kelvin?"
    first = proxy.chat(question)
    assert first.headers["x-kvgate-cache"] == "miss"
    content = first.json()["choices"][0]["message"]["content"]
    hit = proxy.chat(question)
    assert hit.headers["x-kvgate-cache"] == "exact" and hit.json()["choices"][0]["message"]["content"] == content
    semantic = proxy.chat("At sea level, what is the boiling point of water in kelvin?")
    assert semantic.headers["x-kvgate-cache"] in ("semantic", "miss")
    entries = proxy.pipeline.index.entries
    config = parse_config(encrypted_config(backend, tmp_path / "cache", **extra))
    view = build_view(
        config,
        {"model": "demo-1", "messages": [{"role": "user", "content": question}]},
        tenant_of("key-a"),
        CacheControl(),
    )
    entry_id = entries.exact_id(view.exact_key)
    if store == "local":
        assert content.encode() not in db_bytes(tmp_path / "cache" / "responses")
        write = lambda value: entries.cache.set(f"e:{entry_id}", unseal(value))  # noqa: E731  (its layer seals)
    else:
        r = entries.link.client
        assert not any(content.encode() in v for k in r.keys("p:e:*") for v in r.hgetall(k).values())
        write = lambda value: r.hset(f"p:e:{entry_id}", "j", value)  # noqa: E731
    forged = CacheEntry(entry_id, "whatever", {"choices": [{"message": {"role": "assistant", "content": "forged"}}]})
    write(seal(forged.to_bytes()))  # a forged answer, written without the key
    after = proxy.chat(question)
    assert after.status_code == 200 and after.headers["x-kvgate-cache"] == "miss" and "forged" not in after.text
    metrics = proxy.http.get("/metrics").text
    assert 'kvgate_decrypt_failures_total{layer="entries"} 1.0' in metrics
