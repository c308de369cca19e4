"""Erasing a tenant and invalidating tags, without servers: tags and their checks, the response
index's erase/invalidate and model-revision staleness, the request log's erasure, salt epochs
(disk and Redis) and the salt they change. Through the proxy: tests/test_governance_e2e.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvgate.index.responses.entries.redis import RedisEntryStore
from kvgate.index.responses.governance import erase_tenant, invalidate
from kvgate.index.responses.semantic import SemanticIndex
from kvgate.index.responses.tags import MAX_TAGS, model_tag, system_tag, tag_problem, tenant_term
from kvgate.index.storage.redis_link import LinkSettings, RedisLink
from kvgate.middleware.cache.request_log import DiskRequestLog, RequestRecord, new_request_id
from kvgate.middleware.cache.request_log_redis import RedisRequestLog
from kvgate.middleware.config import parse_config
from kvgate.middleware.errors import BadRequest
from kvgate.middleware.request import CacheControl, build_view
from kvgate.middleware.routing.epochs import Epochs, tenant_digest
from kvgate.middleware.routing.epochs_disk import DiskEpochStore
from kvgate.middleware.routing.epochs_redis import RedisEpochStore
from kvgate.middleware.routing.salt import Salter
from kvgate.middleware.tags import entry_tags, parse_tags

DIM = 8
CANARY = "CANARY-7f3a9c-erase-me"


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def answer(text: str) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


# ---------------------------------------------------------------- tags
def test_client_tags_are_checked_with_clear_errors() -> None:
    assert parse_tags(" doc:123@v4, team:a ,doc:123@v4") == ("doc:123@v4", "team:a")
    assert parse_tags(["a/b+c=d~e-f.g_h"]) == ("a/b+c=d~e-f.g_h",)
    for bad, words in [
        ("doc 1", "may hold only"),
        ("-x", "may hold only"),
        ("x" * 201, "longer than"),
        ("model:m2", "kvgate's own"),
        ("system:abc", "kvgate's own"),
        ("tenant:x", "kvgate's own"),
    ]:
        with pytest.raises(BadRequest) as err:
            parse_tags([bad], param="cache_tags")
        assert words in err.value.message and err.value.param == "cache_tags"
    with pytest.raises(BadRequest, match=f"at most {MAX_TAGS}"):
        parse_tags(",".join(f"t{i}" for i in range(MAX_TAGS + 1)))
    with pytest.raises(BadRequest, match="list of tags"):
        parse_tags({"doc": 1}, param="cache_tags")
    # an operator may name kvgate's own model: and system: tags, never a tenant's index term
    assert tag_problem("model:m2", client=False) is None and tag_problem("tenant:x", client=False) is not None


def test_a_request_is_tagged_with_its_system_prompt_and_the_clients_tags(tmp_path: Path) -> None:
    config = parse_config(
        {"cache_dir": str(tmp_path), "routes": [{"name": "r", "model": "m", "semantic": {"enabled": False}}]}
    )
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": [{"type": "text", "text": "No lists."}]},
        {"role": "user", "content": "hi"},
    ]
    view = build_view(config, {"model": "m", "messages": messages}, "t", CacheControl(tags=("doc:1",)))
    assert entry_tags(view) == ["doc:1", system_tag("You are terse.\nNo lists.")]
    plain = build_view(config, {"model": "m", "messages": messages[2:]}, "t", CacheControl())
    assert entry_tags(plain) == []
    assert model_tag("/models/llama@abc") == "model:/models/llama@abc"
    assert model_tag("a revision with spaces").startswith("model:") and " " not in model_tag("a revision with spaces")


# ---------------------------------------------------------------- the response index
def make_index(tmp_path: Path, store: str, url: str | None = None) -> SemanticIndex:
    if store == "disk":
        return SemanticIndex(tmp_path / "responses", DIM, follow_interval_s=None)
    return SemanticIndex(
        None,
        DIM,
        follow_interval_s=None,
        entries=RedisEntryStore(RedisLink(LinkSettings(url or "")), DIM, key_prefix=f"g{tmp_path.name}:"),
    )


@pytest.fixture(params=["disk", "redis"])
def index(request: pytest.FixtureRequest, tmp_path: Path):
    url = request.getfixturevalue("redis_server").url if request.param == "redis" else None
    idx = make_index(tmp_path, request.param, url)
    yield idx
    idx.close()


def test_erase_removes_one_tenants_entries_vectors_and_marks_only(index: SemanticIndex) -> None:
    mine = [
        index.add(
            "s-acme",
            answer(f"{CANARY} {i}"),
            exact_key=f"a{i}",
            text=f"{CANARY} q{i}",
            vector=unit(i),
            tenant="acme",
            tags=["doc:1"],
        )
        for i in range(3)
    ]
    shared = index.add("s-shared", answer(f"{CANARY} shared"), exact_key="as", text=CANARY, tenant="acme")
    theirs = [
        index.add(
            "s-umb",
            answer(f"theirs {i}"),
            exact_key=f"u{i}",
            text=f"q{i}",
            vector=unit(10 + i),
            tenant="umbrella",
            tags=["doc:1"],
        )
        for i in range(2)
    ]
    index.tighten("s-shared", unit(1), 0.8, tenant="acme")
    index.tighten("s-shared", unit(2), 0.85, tenant="umbrella")
    index.tighten("s-acme", unit(3), 0.9, tenant="acme")
    # an index row lost (Redis evicting a set) does not save an entry from the erasure
    index.entries.link.client.delete(index.entries._g + tenant_term("acme")) if isinstance(
        index.entries, RedisEntryStore
    ) else None
    erased = erase_tenant(index, "acme")
    assert (erased.entries, erased.vectors, erased.marks, erased.scrubbed) == (4, 3, 2, True)
    assert all(index.get(e.id) is None for e in [*mine, shared]) and index.get_exact("a0") is None
    assert index.search("s-acme", unit(0), k=3) == []
    assert [index.get(e.id).text for e in theirs] == ["q0", "q1"]
    assert [m.tenant for m in index.marks("s-shared")] == ["umbrella"] and index.marks("s-acme") == []
    assert erase_tenant(index, "acme").entries == 0  # idempotent


def test_invalidate_by_tag_everyones_or_one_tenants(index: SemanticIndex) -> None:
    a = index.add("s1", answer("a"), exact_key="a", tenant="acme", tags=["doc:1@v4", "team:x"])
    b = index.add("s2", answer("b"), exact_key="b", tenant="umbrella", tags=["doc:1@v4"])
    c = index.add("s3", answer("c"), exact_key="c", tenant="umbrella", tags=["doc:2"])
    assert invalidate(index, ["doc:1@v4"], tenant="umbrella") == 1  # a tenant's call leaves others' entries
    assert index.get(a.id) is not None and index.get(b.id) is None
    assert invalidate(index, ["team:x", "doc:nope"]) == 1 and index.get(a.id) is None
    assert invalidate(index, ["doc:2"], sweep=True) == 1 and index.get(c.id) is None
    assert invalidate(index, ["doc:2"]) == 0


def test_an_answer_of_another_model_revision_is_stale(index: SemanticIndex) -> None:
    revision: dict[str, str | None] = {"r": None}
    index.revision_of = lambda route: revision.get(route)
    before = index.add("s", answer("old"), exact_key="k0", vector=unit(0), route="r")
    assert before.tags is None and index.get_exact("k0") is not None  # no revision known: nothing is stale
    revision["r"] = "/models/m@rev1"
    assert index.get_exact("k0") is None  # made before a revision was known: stale once one is
    made = index.add("s", answer("rev1"), exact_key="k1", vector=unit(1), route="r", tags=["doc:1"])
    assert made.tags == ["doc:1", "model:/models/m@rev1"]
    assert index.get_exact("k1").id == made.id and [e.id for e, _ in index.search("s", unit(1))] == [made.id]
    revision["r"] = "/models/m@rev2"
    assert index.search("s", unit(1)) == [] and index.get_exact("k1") is None
    assert index.get(made.id) is None and index.stale_dropped >= 2  # deleted, not only skipped
    other = index.add("s", answer("other route"), exact_key="k2", route="unversioned")
    assert index.get_exact("k2").id == other.id


def test_disk_erasure_leaves_no_plaintext_in_the_directory(tmp_path: Path) -> None:
    idx = make_index(tmp_path, "disk")
    for i in range(50):
        idx.add(
            f"s{i % 3}",
            answer(f"{CANARY} answer {i} " + "x" * 200),
            exact_key=f"k{i}",
            text=f"{CANARY} {i}",
            vector=unit(i),
            tenant="acme",
        )
    kept = idx.add("s", answer("someone else's answer"), exact_key="other", tenant="umbrella")
    assert raw_hits(tmp_path / "responses", CANARY.encode())  # the scan finds it before
    assert erase_tenant(idx, "acme").entries == 50
    assert raw_hits(tmp_path / "responses", CANARY.encode()) == []
    # zeroed on delete whatever the SQLite build's default, in every connection diskcache opens
    assert idx.entries.cache._sql("PRAGMA secure_delete").fetchone() == (1,)
    assert idx.get_exact("other").id == kept.id
    idx.close()


def raw_hits(directory: Path, needle: bytes) -> list[Path]:
    """Files under `directory` whose raw bytes hold `needle`."""
    return [p for p in directory.rglob("*") if p.is_file() and needle in p.read_bytes()]


# ---------------------------------------------------------------- the request log
def test_request_log_erasure_disk_and_redis(tmp_path: Path, redis_server) -> None:
    logs = [
        DiskRequestLog(tmp_path / "requests", ttl=3600, max_bytes=2**20),
        RedisRequestLog(RedisLink(LinkSettings(redis_server.url)), "rl:", ttl=3600),
    ]
    for log in logs:
        ids = {t: [new_request_id() for _ in range(3)] for t in ("acme", "umbrella")}
        for tenant, rids in ids.items():
            for rid in rids:
                log.record(rid, RequestRecord(tenant, "r", "miss", "scope", 1))
        assert log.erase_tenant("acme") == 3 and log.erase_tenant("acme") == 0
        assert all(log.get(r) is None for r in ids["acme"]) and all(log.get(r) for r in ids["umbrella"])
        log.close()
    logs[1].link.close()


# ---------------------------------------------------------------- salt records (more: tests/test_salt_records.py)
@pytest.mark.parametrize("backend", ["disk", "redis"])
def test_a_bumped_epoch_changes_only_that_tenants_salt_in_every_process(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "disk":
        stores = [DiskEpochStore(tmp_path / "tenants"), DiskEpochStore(tmp_path / "tenants")]
    else:
        link = RedisLink(LinkSettings(request.getfixturevalue("redis_server").url))
        stores = [RedisEpochStore(link, "ep:"), RedisEpochStore(link, "ep:")]
    here, there = Epochs(stores[0], interval_s=0.0), Epochs(stores[1], interval_s=0.0)
    salters = [Salter(b"s" * 32, here.record), Salter(b"s" * 32, there.record)]
    before, umbrella = salters[0].salt("acme"), salters[0].salt("umbrella")
    assert before == salters[1].salt("acme") and umbrella == salters[1].salt("umbrella") != before
    assert here.bump("acme") == 1 and here.record("acme").epoch == 1
    assert salters[0].salt("acme") not in (before, umbrella) and salters[1].salt("acme") == salters[0].salt("acme")
    assert salters[0].salt("acme", "client") != salters[0].salt("acme")
    assert salters[0].salt("umbrella") == salters[1].salt("umbrella") == umbrella
    assert there.bump("acme") == 2 and here.record("acme").epoch == 2
    digests = [tenant_digest("acme"), tenant_digest("umbrella")]
    assert set(stores[0].records(digests)) == set(digests)  # named by digest: no tenant name in the store
    if backend == "disk":
        assert b"acme" not in b"".join(p.read_bytes() for p in (tmp_path / "tenants").rglob("*") if p.is_file())
    for store in stores:
        store.close()


def test_epochs_read_the_store_at_most_every_interval_and_survive_it_failing(tmp_path: Path) -> None:
    class Flaky(DiskEpochStore):
        broken = False
        reads = 0

        def generation(self) -> int:
            self.reads += 1
            if self.broken:
                raise OSError("disk gone")
            return super().generation()

    store = Flaky(tmp_path / "tenants")
    assert store.records([tenant_digest("acme")]) == {} and not (tmp_path / "tenants").exists()  # reads create nothing
    epochs = Epochs(store, interval_s=3600)
    first = epochs.record("acme")
    assert first.epoch == 0 and epochs.record("acme") == first and store.reads == 1
    DiskEpochStore(tmp_path / "tenants").bump(tenant_digest("acme"), b"n" * 32)  # another process
    assert epochs.record("acme") == first  # not looked again yet
    epochs.interval_s = 0.0
    assert epochs.record("acme").epoch == 1 and epochs.record("acme").nonce == b"n" * 32
    store.broken = True
    assert epochs.record("acme").epoch == 1  # the last copy stands
    store.close()
