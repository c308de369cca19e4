"""The vLLM KV connector's parts that need no vLLM: settings, the scheduler's load/save arithmetic,
the key namespace, the tiers' event media, and the worker's copies between paged KV and a real
chunk store (raw codec, so loads are bit-exact)."""

from __future__ import annotations

import json
import threading
import types
from pathlib import Path
from typing import Iterator

import pytest
import torch

from kvgate.engines.vllm.kv_connector import namespace as ns
from kvgate.engines.vllm.kv_connector.events import media
from kvgate.engines.vllm.kv_connector.plan import LoadPlan, chunks_to_save, low64, plan_load
from kvgate.engines.vllm.kv_connector.settings import SettingsError, build_tiers, chunk_blocks, parse
from kvgate.engines.vllm.kv_connector.step_save import copy_out
from kvgate.engines.vllm.kv_connector.worker import Counters, Loader, LoadSpec, PagedKV, Saver, SaveSpec
from kvgate.index.kv.chunks import ChunkStore, MemoryTier
from kvgate.index.kv.chunks.layer_codec import LayerCodec
from kvgate.index.storage.env import MissingSecret

T = "kv_connector_extra_config.tiers"


def disk(path: str = "/tmp/kv", **extra: object) -> dict[str, object]:
    return {"tiers": {"disk": {"path": path}}, **extra}


# -- settings ----------------------------------------------------------------------------------------
def test_parse_valid_config_round_trips_into_the_dataclasses() -> None:
    s = parse(
        {
            "tiers": {
                "memory": {"capacity_mb": 256},
                "disk": {"path": "/tmp/kv", "capacity_mb": 2048},
                "remote": {
                    "url": "redis://kv:6379/2",
                    "password_env": "PW",
                    "key_prefix": "p",
                    "timeout_s": 0.25,
                    "ttl_s": 60,
                },
            },
            "chunk_blocks": "auto",
        }
    )
    assert s.memory.capacity_mb == 256 and s.disk.path == "/tmp/kv" and s.disk.capacity_mb == 2048
    assert (s.remote.url, s.remote.password_env, s.remote.key_prefix) == ("redis://kv:6379/2", "PW", "p")
    assert (s.remote.timeout_s, s.remote.ttl_s) == (0.25, 60)
    assert (s.codec, s.entropy, s.chunk_blocks, s.min_chunk_mb) == ("int8", "none", None, 1.0)
    assert s.tier_names == ["memory", "disk", "remote"]


@pytest.mark.parametrize(
    "extra, match",
    [
        ({}, rf"{T}: required"),
        ({"tiers": {"memory": {"capacity_mb": 64}}}, rf"{T}: name a disk or a remote tier"),
        ({"tiers": {"disk": {"capacity_mb": 64}}}, rf"{T}\.disk\.path: required"),
        (disk(colour="red"), r"kv_connector_extra_config: unknown field\(s\) \['colour'\]"),
        ({"tiers": {"disk": {"path": "/tmp/kv", "size": 1}}}, rf"{T}\.disk: unknown field\(s\) \['size'\]"),
        ({"tiers": {"remote": {"url": "redis://u:secret@kv:6379/0"}}}, rf"{T}\.remote\.url: holds a password"),
        ({"tiers": {"remote": {"url": "redis://kv/0", "password": "x"}}}, rf"{T}\.remote\.password:"),
        (disk(codec="fp4"), r"kv_connector_extra_config\.codec: expected one of"),
        (disk(chunk_blocks=0), r"kv_connector_extra_config\.chunk_blocks:"),
        (disk(chunk_blocks=True), r"kv_connector_extra_config\.chunk_blocks:"),
        ({"tiers": {"disk": "/tmp/kv"}}, rf"{T}\.disk: expected an object, got str"),
    ],
)
def test_parse_refuses_bad_settings_naming_the_field(extra: dict[str, object], match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        parse(extra)


def test_chunk_blocks_explicit_setting_wins_and_auto_reaches_min_chunk_mb() -> None:
    assert chunk_blocks(parse(disk(chunk_blocks=5)), 10 << 20) == 5
    auto = parse(disk(min_chunk_mb=1))
    assert chunk_blocks(auto, 2_900_000) == 1
    assert chunk_blocks(auto, 368_640) == 3  # 2 blocks are 737 280 bytes < 1 MiB
    assert chunk_blocks(auto, 1 << 20) == 1 and chunk_blocks(auto, (1 << 19) - 1) == 3
    # with the block size known, at least min_chunk_tokens (128) tokens: eight 16-token GPU blocks,
    # one 128-token CPU block; whichever minimum asks more wins
    assert chunk_blocks(auto, 2 << 20, 16) == 8 and chunk_blocks(auto, 2_900_000, 128) == 1
    assert chunk_blocks(auto, 64 << 10, 16) == 16  # 1 MiB needs 16 blocks of 64 KiB
    assert chunk_blocks(parse(disk(min_chunk_tokens=1)), 2 << 20, 16) == 1
    assert chunk_blocks(parse(disk(chunk_blocks=2)), 2 << 20, 16) == 2  # explicit wins


def test_build_tiers_without_memory_omits_memory(tmp_path: Path) -> None:
    s = parse({"tiers": {"memory": {"capacity_mb": 8}, "disk": {"path": str(tmp_path / "kv")}}})
    both, worker_less = build_tiers(s), build_tiers(s, with_memory=False)
    try:
        assert [t.name for t in both] == ["memory", "disk"]
        assert [t.name for t in worker_less] == ["disk"]
    finally:
        for t in both + worker_less:
            t.close()


def test_build_tiers_unset_password_env_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVGATE_TEST_UNSET_PW", raising=False)
    s = parse({"tiers": {"remote": {"url": "redis://127.0.0.1:1/0", "password_env": "KVGATE_TEST_UNSET_PW"}}})
    with pytest.raises(
        MissingSecret,
        match="kv_connector_extra_config.tiers.remote.password_env: the environment variable KVGATE_TEST_UNSET_PW is not set",
    ):
        build_tiers(s)


def test_build_tiers_unreachable_remote_builds_without_error() -> None:
    (tier,) = build_tiers(parse({"tiers": {"remote": {"url": "redis://127.0.0.1:1/0", "timeout_s": 0.1}}}))
    assert tier.name == "remote"
    tier.close()


# -- plan ----------------------------------------------------------------------------------------------
def test_low64_of_bytes_and_ints() -> None:
    b = bytes(range(1, 33))
    assert low64(b) == int.from_bytes(b, "big") & (2**64 - 1) == int.from_bytes(b[-8:], "big")
    assert low64((7 << 64) | 5) == 5 and low64(-1) == 2**64 - 1 and low64(42) == 42


class Stored:
    """longest_prefix over a set of stored chunk hashes, recording what it was asked."""

    def __init__(self, *hashes: int) -> None:
        self.hashes, self.asked = set(hashes), []

    def __call__(self, chunk_hashes: list[int]) -> int:
        self.asked.append(list(chunk_hashes))
        return next((i for i, h in enumerate(chunk_hashes) if h not in self.hashes), len(chunk_hashes))


H = [100, 101, 102, 103, 104]  # block hashes of five full blocks


@pytest.mark.parametrize("cb", [1, 2])
def test_plan_load_nothing_stored_is_none(cb: int) -> None:
    assert plan_load(H[:4], 16, 0, 4, cb, Stored()) is None


def test_plan_load_all_stored_never_covers_the_last_token() -> None:
    assert plan_load(H[:4], 16, 0, 4, 1, Stored(*H)) == LoadPlan(0, 3, 0, 12)  # (16-1)//4 = 3 blocks
    assert plan_load(H[:4], 16, 0, 4, 2, Stored(*H)) == LoadPlan(0, 1, 0, 8)  # chunk 1 would end at token 16
    assert plan_load(H[:4], 17, 0, 4, 2, Stored(*H)) == LoadPlan(0, 2, 0, 16)


def test_plan_load_after_engine_computed_tokens_starts_at_its_chunk() -> None:
    got = Stored(*H)
    assert plan_load(H, 20, 8, 4, 1, got) == LoadPlan(first_chunk=2, n_chunks=2, skip_blocks=0, tokens=8)
    assert got.asked == [[102, 103]]
    assert plan_load(H[:4], 16, 12, 4, 1, Stored(*H)) is None  # nothing beyond the engine's own cache


def test_plan_load_stops_at_a_gap() -> None:
    assert plan_load(H, 20, 0, 4, 1, Stored(100, 101, 103)) == LoadPlan(0, 2, 0, 8)
    assert plan_load(H, 20, 8, 4, 1, Stored(100, 101, 103)) is None


def test_plan_load_chunk_of_two_with_one_computed_block_skips_it() -> None:
    got = Stored(*H)
    assert plan_load(H, 20, 4, 4, 2, got) == LoadPlan(first_chunk=0, n_chunks=2, skip_blocks=1, tokens=12)
    assert got.asked == [[101, 103]]  # only chunk-end blocks, from chunk 0 on


def test_plan_load_asks_only_chunk_ends_from_the_first_chunk_on() -> None:
    got = Stored()
    assert plan_load(list(range(1000, 1010)), 41, 16, 4, 2, got) is None
    assert got.asked == [[1005, 1007, 1009]]  # chunks 2..4 end at blocks 5, 7, 9


def test_chunks_to_save_ranges() -> None:
    assert chunks_to_save(0, 12, 3, 4, 2) == range(0, 1)  # partially into chunk 1
    assert chunks_to_save(0, 16, 4, 4, 2) == range(0, 2)  # exactly at the end of chunk 1
    assert chunks_to_save(0, 16, 3, 4, 2) == range(0, 1)  # last block not hashed yet
    assert chunks_to_save(1, 16, 4, 4, 2) == range(1, 2)
    assert chunks_to_save(3, 16, 4, 4, 2) == range(3, 3)  # never below saved_upto
    assert list(chunks_to_save(0, 3, 0, 4, 1)) == []


# -- namespace -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["0.32.0", "0.32.1", "0.32"])
def test_check_version_accepts_supported(version: str) -> None:
    ns.check_version(version)


@pytest.mark.parametrize("version", ["0.31.9", "0.33.0", "1.0", "0.320"])
def test_check_version_refuses_others_naming_the_version(version: str) -> None:
    with pytest.raises(ns.UnsupportedVllm, match=f"runs vLLM {version}\\."):
        ns.check_version(version)


def test_model_identity_of_a_hub_name_includes_the_revision() -> None:
    assert ns.model_identity("org/no-such-model", None) == "org/no-such-model@main"
    assert ns.model_identity("org/no-such-model", "abc123") == "org/no-such-model@abc123"


def test_model_identity_of_a_directory_follows_config_and_weight_sizes(tmp_path: Path) -> None:
    d = tmp_path / "my-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"hidden_size": 64}))
    (d / "model.safetensors").write_bytes(b"x" * 10)
    first = ns.model_identity(str(d), None)
    assert first.startswith("my-model#") and ns.model_identity(str(d), "rev") == first
    (d / "config.json").write_text(json.dumps({"hidden_size": 128}))
    second = ns.model_identity(str(d), None)
    (d / "model.safetensors").write_bytes(b"x" * 20)
    third = ns.model_identity(str(d), None)
    assert len({first, second, third}) == 3
    assert ns.model_identity(str(d), None) == third


def test_namespace_differs_in_any_part_and_is_stable() -> None:
    parts = {"model": "org/m@main", "kv_dtype": "bfloat16", "block_size": 16, "layers": 2, "device": "cuda"}
    base = ns.namespace(parts, 0)
    assert base == ns.namespace(dict(reversed(list(parts.items()))), 0)
    assert base.startswith("org_m:") and base.endswith(":r0")
    others = {
        ns.namespace({**parts, "kv_dtype": "float16"}, 0),
        ns.namespace({**parts, "block_size": 32}, 0),
        ns.namespace(parts, 1),
    }
    assert base not in others and len(others) == 3


def fake_vllm_config(cache_dtype: str) -> types.SimpleNamespace:
    mc = types.SimpleNamespace(
        model="org/no-such-model",
        revision="r1",
        dtype=torch.bfloat16,
        get_num_layers=lambda pc: 4,
        get_num_kv_heads=lambda pc: 2,
        get_head_size=lambda: 64,
    )
    return types.SimpleNamespace(
        model_config=mc,
        cache_config=types.SimpleNamespace(block_size=16, cache_dtype=cache_dtype),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=2, pipeline_parallel_size=1),
    )


def test_vllm_parts_kv_dtype_follows_model_or_cache_dtype() -> None:
    parts = ns.vllm_parts(fake_vllm_config("auto"), "cuda")
    assert parts == {
        "model": "org/no-such-model@r1",
        "kv_dtype": "bfloat16",
        "block_size": 16,
        "layers": 4,
        "kv_heads": 2,
        "head_size": 64,
        "tp": 2,
        "pp": 1,
        "device": "cuda",
    }
    assert ns.vllm_parts(fake_vllm_config("fp8"), "cuda")["kv_dtype"] == "fp8"


# -- events.media --------------------------------------------------------------------------------------
def test_media_memory_and_disk_identity(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    a = media(parse({"tiers": {"memory": {}, "disk": {"path": str(tmp_path / "a")}}}))
    assert a["memory"] == "memory" and a["disk"].startswith("disk:")
    assert media(parse(disk(str(tmp_path / "link"))))["disk"] == a["disk"]
    assert media(parse(disk(str(tmp_path / "b"))))["disk"] != a["disk"]


def test_media_remote_depends_on_address_and_prefix_only() -> None:
    def remote(url: str, prefix: str = "kvgate", env: str | None = None) -> str:
        r = {"url": url, "key_prefix": prefix, **({"password_env": env} if env else {})}
        return media(parse({"tiers": {"remote": r}}))["remote"]

    base = remote("redis://kvhost:6379/0", env="SECRET_PW_VAR")
    assert base.startswith("remote:") and "kvhost" not in base and "SECRET_PW_VAR" not in base
    assert base == remote("redis://kvhost:6379/0")
    assert (
        len(
            {
                base,
                remote("redis://other:6379/0"),
                remote("redis://kvhost:6379/1"),
                remote("redis://kvhost:6379/0", prefix="p2"),
            }
        )
        == 4
    )


# -- worker --------------------------------------------------------------------------------------------
def paged(fill: str = "randn", shape: tuple[int, ...] = (10, 2, 4, 8)) -> PagedKV:
    return PagedKV({f"l{i}": getattr(torch, fill)(*shape, dtype=torch.bfloat16) for i in range(3)})


def test_copy_out_copies_and_scatter_writes() -> None:
    kv = paged()
    _, rows, done = copy_out(kv, [SaveSpec(1, [1], [3, 7])])[0]
    assert done.event is None and [tuple(r.shape) for r in rows] == [(2, 2, 4, 8)] * 3
    expect = [torch.stack([layer[3], layer[7]]).clone() for layer in kv.layers]
    for layer in kv.layers:
        layer.fill_(0)
    assert all(torch.equal(r, e) for r, e in zip(rows, expect))
    kv.scatter(rows, [1, 9])
    for layer, e in zip(kv.layers, expect):
        assert torch.equal(layer[1], e[0]) and torch.equal(layer[9], e[1]) and not layer[0].any()


def test_paged_kv_refuses_layers_of_different_shapes() -> None:
    with pytest.raises(ValueError, match="layer b"):
        PagedKV({"a": torch.zeros(10, 2, 4, 8), "b": torch.zeros(10, 2, 4, 16)})


@pytest.fixture
def store() -> Iterator[ChunkStore]:
    s = ChunkStore([MemoryTier(1 << 26)], "ns", LayerCodec("raw"))
    yield s
    s.close()


def save(store: ChunkStore, kv: PagedKV, specs: list[SaveSpec]) -> list[SaveSpec]:
    stored: list[SaveSpec] = []
    saver = Saver(store, 4, Counters(), stored.append)
    try:
        for spec in specs:
            assert saver.submit(*copy_out(kv, [spec])[0])
        saver.drain()
    finally:
        saver.close()
    return stored


def test_saver_and_loader_round_trip_exactly(store: ChunkStore) -> None:
    src, dst, counters = paged(), paged("zeros"), Counters()
    spec = SaveSpec(chunk_hash=11, block_hashes=[11], block_ids=[3])
    assert save(store, src, [spec]) == [spec]
    (loader := Loader(store, dst, counters)).load(LoadSpec("r", [11], [[5]], skip=0))
    assert all(torch.equal(d[5], s[3]) for d, s in zip(dst.layers, src.layers))
    assert loader.take_failed() == set() and (counters.loaded_chunks, counters.load_errors) == (1, 0)


def test_loader_reports_a_missing_chunk_failed(store: ChunkStore) -> None:
    src, dst, counters = paged(), paged("zeros"), Counters()
    save(store, src, [SaveSpec(11, [11], [3])])
    (loader := Loader(store, dst, counters)).load(LoadSpec("r", [11, 99], [[5], [6]], skip=0))
    assert all(torch.equal(d[5], s[3]) and not d[6].any() for d, s in zip(dst.layers, src.layers))
    assert loader.take_failed() == {6} and loader.take_failed() == set()
    assert (counters.loaded_chunks, counters.load_errors) == (1, 1)


def test_loader_refuses_a_misshapen_chunk(store: ChunkStore) -> None:
    save(store, paged(shape=(10, 2, 4, 16)), [SaveSpec(12, [12], [3])])
    dst, counters = paged("zeros"), Counters()
    (loader := Loader(store, dst, counters)).load(LoadSpec("r", [12], [[5]], skip=0))
    assert loader.take_failed() == {5} and counters.load_errors == 1 and counters.loaded_chunks == 0
    assert not any(layer.any() for layer in dst.layers)


def test_loader_skip_writes_only_the_blocks_the_engine_lacks(store: ChunkStore) -> None:
    src, dst = paged(), paged("zeros")
    save(store, src, [SaveSpec(21, [20, 21], [1, 2])])
    (loader := Loader(store, dst, Counters())).load(LoadSpec("r", [21], [[6, 7]], skip=1))
    assert all(not d[6].any() and torch.equal(d[7], s[2]) for d, s in zip(dst.layers, src.layers))
    assert loader.take_failed() == set()


class BlockingStore:
    """A store whose put_many waits until released (so the saver's queue fills deterministically)."""

    def __init__(self) -> None:
        self.entered, self.release, self.puts = threading.Event(), threading.Event(), []

    def put_many(self, hashes: list[int], chunks: list[list[torch.Tensor]], salt: str | None = None) -> int:
        self.entered.set()
        assert self.release.wait(10)
        self.puts.append(list(hashes))
        return len(hashes)


def test_saver_drops_saves_when_its_queue_is_full() -> None:
    kv, blocking, counters, stored = paged(), BlockingStore(), Counters(), []
    saver = Saver(blocking, 1, counters, stored.append)
    try:
        assert saver.submit(*copy_out(kv, [SaveSpec(1, [1], [0])])[0])
        assert blocking.entered.wait(10)  # the writer holds chunk 1; the queue is empty again
        assert saver.submit(*copy_out(kv, [SaveSpec(2, [2], [1])])[0])
        assert not saver.submit(*copy_out(kv, [SaveSpec(3, [3], [2])])[0])
        assert counters.dropped_saves == 1
    finally:
        blocking.release.set()
        saver.drain()
        saver.close()
    assert blocking.puts == [[1], [2]] and [s.chunk_hash for s in stored] == [1, 2] and counters.saved_chunks == 2


def test_connector_tiers_on_a_redis_with_a_password(monkeypatch, tmp_path):
    """The connector's remote tier, built from its settings, against a real Redis that requires a
    password: the password comes from the named environment variable, never from the config."""
    from kvgate.tools.redis_proc import RedisServer

    server = RedisServer(password="s3cret-pw").start()
    try:
        cfg = {
            "tiers": {"remote": {"url": server.url, "password_env": "KVGATE_TEST_REDIS_PW", "key_prefix": "t"}},
            "codec": "int4",
        }
        monkeypatch.setenv("KVGATE_TEST_REDIS_PW", "s3cret-pw")
        store = ChunkStore(build_tiers(parse(cfg)), "ns", LayerCodec("int4"))
        rows = [torch.randn(1, 2, 4, 64, dtype=torch.bfloat16) for _ in range(3)]
        assert store.put_many([7], [rows]) == 1
        got = store.get_many([7])
        assert len(got) == 1 and got[0].codec == "int4" and got[0].tensors()[0].shape == rows[0].shape
        monkeypatch.setenv("KVGATE_TEST_REDIS_PW", "wrong")
        wrong = ChunkStore(build_tiers(parse(cfg)), "ns", LayerCodec())
        assert wrong.get_many([7]) == []  # refused by Redis: a miss, not an error
        for s in (store, wrong):
            s.close()
    finally:
        server.stop()
