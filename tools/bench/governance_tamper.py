"""Tampering with encrypted data at rest, for `kvgate bench governance`: every try must be a miss,
never served and never an error to the client.

Response entries: a proxy over an encrypted entry store (the local diskcache store, and the Redis
store when redis-server is installed) stores answers; then each stored entry is changed in place,
one way per entry, and its question asked again, which must come back a miss answered by the
backend (status 200). Ways, from crude to informed:
  flip           one byte of the stored value flipped where it lies (the outer checksum catches it);
  flip_resealed  one ciphertext byte flipped and the outer SHA-256 seal recomputed, as someone who
                 knows the format would (only AES-GCM's tag catches it);
  swap           another entry's valid ciphertext filed under this id (the storage key is the
                 associated data);
  other_key      the entry sealed under another master key (an old key after a rotation);
  plaintext      a forged answer written unencrypted, as a store without encryption holds it.
KV chunks: a ChunkStore over encrypted disk (and Redis) tiers; each chunk changed one way (flip,
swap, other_key, plaintext, or read with another tenant's salt) and loaded with `get_many`, which
must return nothing and raise nothing.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable

import httpx

ENTRY_WAYS = ("flip", "flip_resealed", "swap", "other_key", "plaintext")
CHUNK_WAYS = ("flip", "swap", "other_key", "plaintext", "other_salt")
FORGED = "FORGED ANSWER"
SALT = "tenant-a-salt"


class Tally:
    """tried / served / errors, in all and by way."""

    def __init__(self) -> None:
        self.by_way: dict[str, dict[str, int]] = {}

    def add(self, where: str, way: str, served: bool, error: bool) -> None:
        row = self.by_way.setdefault(f"{where}:{way}", {"tried": 0, "served": 0, "errors": 0})
        row["tried"] += 1
        row["served"] += served
        row["errors"] += error

    def report(self) -> dict[str, Any]:
        total = {k: sum(r[k] for r in self.by_way.values()) for k in ("tried", "served", "errors")}
        return {**total, "by_way": dict(sorted(self.by_way.items()))}


def _flip(raw: bytes, at: int) -> bytes:
    out = bytearray(raw)
    out[at % len(out)] ^= 0x01
    return bytes(out)


class _DiskRaw:
    """The raw values of a DiskEntryStore's database, as someone with the directory sees them."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.db = sqlite3.connect(str(Path(store.directory) / "cache.db"), timeout=10)

    def get(self, key: str) -> bytes:
        (value,) = self.db.execute("SELECT value FROM Cache WHERE key = ?", (key,)).fetchone()
        if value is None:
            raise RuntimeError(f"{key} is kept in a value file, not in the database: keep answers short")
        return bytes(value)

    def put_raw(self, key: str, value: bytes) -> None:
        self.db.execute("UPDATE Cache SET value = ? WHERE key = ?", (value, key))
        self.db.commit()

    def close(self) -> None:
        self.db.close()


class _RedisRaw:
    """The j fields of a RedisEntryStore's entry hashes under `prefix`."""

    def __init__(self, store: Any, prefix: str) -> None:
        self.r, self.prefix = store.link.client, prefix

    def get(self, key: str) -> bytes:
        return bytes(self.r.hget(self.prefix + key, "j"))

    def put_raw(self, key: str, value: bytes) -> None:
        self.r.hset(self.prefix + key, "j", value)

    def close(self) -> None:
        pass


def _tamper_entry(raw: Any, way: str, entry_id: int, other_id: int, scope: str, other_key: Any) -> None:
    """Change entry `entry_id` as `way` says (module docstring), through `raw`."""
    from kvgate.index.responses.entries import CacheEntry
    from kvgate.index.storage.sealed import seal, unseal

    key = f"e:{entry_id}"
    stored = raw.get(key)
    if way == "flip":
        raw.put_raw(key, _flip(stored, len(stored) // 2))
    elif way == "flip_resealed":
        inner = unseal(stored)
        raw.put_raw(key, seal(_flip(inner, len(inner) - 20)))
    elif way == "swap":
        raw.put_raw(key, raw.get(f"e:{other_id}"))
    else:
        forged = CacheEntry(
            entry_id,
            scope,
            {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": FORGED}}]},
        )
        plain = forged.to_bytes()
        raw.put_raw(key, seal(plain if way == "plaintext" else other_key.seal(plain, scope, key)))


def tamper_entries(
    work: Path,
    backend: str,
    embedder: Any,
    tally: Tally,
    *,
    per_way: int = 3,
    redis_url: str | None = None,
    encrypted: bool = True,
) -> dict[str, int]:
    """Store answers through an encrypted proxy, change each one way, ask again (module docstring).
    Returns the cipher's failure counts. `encrypted=False`: the same against a store without
    encryption, the control that shows what the tries would do there."""
    from kvgate.engines.demo import create_fake_app
    from kvgate.index.responses.entries.disk import DiskEntryStore
    from kvgate.index.responses.entries.redis import RedisEntryStore
    from kvgate.index.storage.cipher import EntryCipher
    from kvgate.index.storage.redis_link import LinkSettings, RedisLink
    from kvgate.middleware.config import parse_config
    from kvgate.middleware.request import CacheControl, build_view
    from kvgate.middleware.server.proxy import tenant_of
    from kvgate.tools.bench.governance_crypto import serve_over
    from kvgate.tools.bench.procs import ServerThread
    from kvgate.tools.bench.proxy_latency import BENCH_TOKEN, CACHE_HEADER, bench_config, chat_body
    from kvgate.tools.bench.seed_questions import SEED_QUESTIONS

    if per_way * len(ENTRY_WAYS) + 1 > len(SEED_QUESTIONS):
        raise ValueError(f"at most {(len(SEED_QUESTIONS) - 1) // len(ENTRY_WAYS)} entries per way")

    cipher = EntryCipher(os.urandom(32)) if encrypted else None
    with ExitStack() as stack:
        fake = ServerThread(create_fake_app()).start()
        stack.callback(fake.stop)
        raw_config = bench_config(work, fake.url, 0.95, 0)
        if backend == "redis":
            raw_config["store"] = {"backend": "redis", "url": redis_url, "key_prefix": "gov:"}
            entries: Any = RedisEntryStore(
                RedisLink(LinkSettings(redis_url or "")), embedder.dim, "gov:", cipher=cipher
            )
        else:
            entries = DiskEntryStore(work / "responses", embedder.dim, cipher)
        config = parse_config(raw_config, "bench config")
        url = serve_over(stack, config, embedder, entries)
        client = stack.enter_context(
            httpx.Client(base_url=url, timeout=60.0, headers={"authorization": f"Bearer {BENCH_TOKEN}"})
        )
        raw = _RedisRaw(entries, "gov:") if backend == "redis" else _DiskRaw(entries)
        stack.callback(raw.close)
        # questions on topics far apart: asking one again finds no other's entry by similarity
        questions = [row[0] for row in SEED_QUESTIONS[: per_way * len(ENTRY_WAYS) + 1]]
        ids = []
        for q in questions:
            view = build_view(config, chat_body(q), tenant_of(BENCH_TOKEN), CacheControl())
            resp = client.post("/v1/chat/completions", json=chat_body(q))
            entry_id = entries.exact_id(view.exact_key)
            if resp.status_code != 200 or entry_id is None:
                raise RuntimeError(f"the proxy did not store the tamper-check answer to {q!r}")
            ids.append((entry_id, view.scope))
        other_key = EntryCipher(os.urandom(32))
        for i, way in enumerate(w for w in ENTRY_WAYS for _ in range(per_way)):
            entry_id, scope = ids[i]
            _tamper_entry(raw, way, entry_id, ids[-1][0], scope, other_key)
            try:
                resp = client.post("/v1/chat/completions", json=chat_body(questions[i]))
            except httpx.HTTPError:
                tally.add(f"entries-{backend}", way, False, True)
                continue
            hit = resp.status_code == 200 and resp.headers.get(CACHE_HEADER) != "miss"
            forged = FORGED in resp.text
            tally.add(f"entries-{backend}", way, hit or forged, resp.status_code != 200)
    return cipher.failures if cipher is not None else {}


def _chunk_store(work: Path, redis_url: str | None, cipher: Any) -> Any:
    from kvgate.index.kv.chunks import ChunkStore, DiskTier
    from kvgate.index.kv.chunks.layer_codec import LayerCodec

    tiers: list[Any] = [DiskTier(work / "kv", 1 << 30)]
    if redis_url:
        from kvgate.index.kv.chunks.redis import RedisTier

        tiers.append(RedisTier(redis_url, prefix="govkv"))
    return ChunkStore(tiers, "bench:tamper:r0", LayerCodec("int8"), cipher)


def _tamper_chunk(store: Any, tier: Any, way: str, h: int, other: int, plain: bytes, other_key: Any) -> None:
    """Change chunk `h` in `tier` as `way` says; `plain` is its codec bytes. A flip on disk
    changes the value file in place; everything else is written through the tier."""
    key = store.key(h)
    if way == "flip" and tier.name == "disk":
        db = sqlite3.connect(str(Path(tier.directory) / "cache.db"), timeout=10)
        try:
            (name,) = db.execute("SELECT filename FROM Cache WHERE key = ?", (key,)).fetchone()
        finally:
            db.close()
        path = Path(tier.directory) / name
        path.write_bytes(_flip(path.read_bytes(), len(plain) // 2))
        return
    if way == "flip":
        value = _flip(bytes(tier.get(key)), len(plain) // 2)
    elif way == "swap":
        value = bytes(tier.get(store.key(other)))
    elif way == "other_key":
        value = bytes(other_key.seal(plain, key, SALT))
    else:
        value = plain
    tier.delete(key)
    if not tier.put(key, value):
        raise RuntimeError(f"the {tier.name} tier refused a tampered chunk")


def tamper_chunks(work: Path, tally: Tally, *, per_way: int = 3, redis_url: str | None = None) -> dict[str, int]:
    """Encrypted chunks changed one way each and loaded (module docstring); the failure counts."""
    import torch

    from kvgate.index.storage.cipher import ChunkCipher

    cipher = ChunkCipher(os.urandom(32))
    store = _chunk_store(work, redis_url, cipher)
    other_key = ChunkCipher(os.urandom(32))
    try:
        gen = torch.Generator().manual_seed(1)
        for tier in store.tiers:
            n = per_way * len(CHUNK_WAYS)
            hashes = list(range(1000, 1000 + n + 1))
            chunks = [[torch.randn(2, 16, 64, generator=gen).to(torch.float16) for _ in range(4)] for _ in hashes]
            store.put_many(hashes, chunks, salt=SALT)
            for i, way in enumerate(w for w in CHUNK_WAYS for _ in range(per_way)):
                h = hashes[i]
                plain = store.codec.encode(chunks[i], store.key(h))
                if way != "other_salt":
                    _tamper_chunk(store, tier, way, h, hashes[-1], plain, other_key)
                only = [t for t in store.tiers if t is not tier]
                for t in only:  # the tampered tier alone holds the chunk
                    t.delete(store.key(h))
                try:
                    got = store.get_many([h], salt="tenant-b-salt" if way == "other_salt" else SALT)
                except Exception:  # counted: tampering must never raise
                    tally.add(f"chunks-{tier.name}", way, False, True)
                    continue
                tally.add(f"chunks-{tier.name}", way, bool(got), False)
            store.clear()
    finally:
        store.close()
    return {"kv": cipher.failures.get("kv", 0)}


def run_tamper(
    work: Path | None = None,
    *,
    per_way: int = 3,
    embedder: Any = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """The `tamper` object of `kvgate bench governance --json`: {tried, served, errors} over every
    way, store and tier, with the per-way rows and the ciphers' failure counts."""
    from kvgate.tools.redis_proc import RedisServer, redis_server_bin

    tally = Tally()
    failures: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-tamper-", dir=work) as tmp, ExitStack() as stack:
        root = Path(tmp)
        redis_url = None
        if redis_server_bin() is not None:
            server = RedisServer().start()
            stack.callback(server.stop)
            redis_url = server.url
        if embedder is None:
            from kvgate.index.responses.embedder import make_embedder

            embedder = make_embedder("onnx")
        for backend in ("disk", *(("redis",) if redis_url else ())):
            progress(f"governance: tampering with encrypted entries ({backend})")
            failures[f"entries-{backend}"] = tamper_entries(
                root / f"entries-{backend}", backend, embedder, tally, per_way=per_way, redis_url=redis_url
            )
        progress("governance: tampering with encrypted KV chunks")
        failures["chunks"] = tamper_chunks(root / "chunks", tally, per_way=per_way, redis_url=redis_url)
    return {**tally.report(), "decrypt_failures": failures, "redis": redis_url is not None}
