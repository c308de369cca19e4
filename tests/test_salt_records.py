"""Tenants' salt records (kvgate.middleware.routing.epochs): the random nonce every tenant's salt
folds in, made once per tenant and agreed on by every proxy of a store (disk, and a real Redis),
kept across restarts, overwritten by an erasure so that no byte of the old one stays in the store,
and never a reason to fail a request or to give two tenants one salt. Through the proxy:
tests/test_governance_e2e.py."""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from pathlib import Path
from typing import Any, Iterator

import diskcache
import pytest

from kvgate.index.storage.redis_link import LinkSettings, RedisLink
from kvgate.middleware.routing.epochs import Epochs, EpochStore, TenantSalt, tenant_digest
from kvgate.middleware.routing.epochs_disk import DiskEpochStore
from kvgate.middleware.routing.epochs_redis import RedisEpochStore
from kvgate.middleware.routing.salt import Salter
from kvgate.tools.bench.governance_scan import redis_items

SECRET = b"s" * 32
PREFIX = "sr:"
TENANTS = ("acme", "umbrella", "initech")


def derivable_salt(tenant: str, epoch: int) -> str:
    """A salt made of the secret, the tenant and its epoch alone: what anyone with the secret can compute."""
    msg = b"tenant\0" + tenant.encode() + (b"\0epoch\0%d" % epoch if epoch else b"")
    return hmac.new(SECRET, msg, hashlib.sha256).hexdigest()[:32]


class Place:
    """One backend's shared place; every `store()` is another proxy's view of it (disk: its own
    connection, as another process has; Redis: its own link)."""

    def __init__(self, backend: str, directory: Path, redis_url: str | None) -> None:
        self.backend, self.directory, self.redis_url = backend, directory, redis_url
        self._opened: list[Any] = []

    def store(self) -> EpochStore:
        if self.backend == "disk":
            store: Any = DiskEpochStore(self.directory)
        else:
            link = RedisLink(LinkSettings(self.redis_url or ""))
            self._opened.append(link)
            store = RedisEpochStore(link, PREFIX)
        self._opened.append(store)
        return store

    def raw(self) -> bytes:
        """Every byte the store holds, read around it: files, or every key and value."""
        if self.backend == "disk":
            return b"\n".join(p.read_bytes() for p in self.directory.rglob("*") if p.is_file())
        return b"\n".join(blob for key, values in redis_items(self.redis_url or "") for blob in (key, *values))

    def write_old_counter(self, tenant: str, epoch: int) -> None:
        """What a version without nonces left: an erasure counter."""
        if self.backend == "disk":
            with diskcache.Cache(str(self.directory)) as cache:
                cache.set(f"e:{tenant_digest(tenant)}", epoch)
        else:
            link = RedisLink(LinkSettings(self.redis_url or ""))
            link.client.hset(f"{PREFIX}salt-epochs", tenant_digest(tenant), epoch)
            link.close()

    def close(self) -> None:
        for thing in reversed(self._opened):
            thing.close()


@pytest.fixture(params=["disk", "redis"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    url = request.getfixturevalue("redis_server").url if request.param == "redis" else None
    shared = Place(request.param, tmp_path / "tenants", url)
    yield shared
    shared.close()


def test_salts_differ_per_tenant_and_epoch_and_none_follows_from_the_secret(place: Place) -> None:
    epochs = Epochs(place.store(), interval_s=0.0)
    salter = Salter(SECRET, epochs.record)
    seen = [salter.salt(t) for t in TENANTS]
    for epoch in (1, 2, 3):
        assert epochs.bump("acme") == epoch
        seen.append(salter.salt("acme"))
    assert len(set(seen)) == len(seen) == 6 and salter.salt("acme") == seen[-1]
    assert not set(seen) & {derivable_salt(t, e) for t in TENANTS for e in range(5)}
    assert Salter(b"t" * 32, epochs.record).salt("acme") != seen[-1]  # the secret still matters


def test_proxies_sharing_a_store_agree_on_a_new_tenants_record(place: Place) -> None:
    proxies = [Epochs(place.store(), interval_s=0.0) for _ in range(6)]
    start = threading.Barrier(len(proxies))
    got: list[str | None] = [None] * len(proxies)

    def first_request(i: int) -> None:
        start.wait()
        got[i] = Salter(SECRET, proxies[i].record).salt("acme")

    threads = [threading.Thread(target=first_request, args=(i,)) for i in range(len(proxies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1 and got[0] is not None
    (held,) = place.store().records([tenant_digest("acme")]).values()
    assert all(p.record("acme") == held for p in proxies) and held.epoch == 0 and len(held.nonce) == 32


def test_a_restart_keeps_every_salt(place: Place) -> None:
    before = Epochs(place.store())
    salts = {t: Salter(SECRET, before.record).salt(t) for t in TENANTS}
    before.bump("umbrella")
    salts["umbrella"] = Salter(SECRET, before.record).salt("umbrella")
    before.close()
    after = Epochs(place.store())
    assert {t: Salter(SECRET, after.record).salt(t) for t in TENANTS} == salts


def test_an_erasure_leaves_no_trace_of_the_old_nonce(place: Place) -> None:
    here, there = Epochs(place.store(), interval_s=0.0), Epochs(place.store(), interval_s=0.0)
    old, other = here.record("acme"), here.record("umbrella")
    assert there.record("acme") == old
    raw = place.raw()
    assert old.nonce.hex().encode() in raw and other.nonce.hex().encode() in raw  # the scan would see it
    assert here.bump("acme") == 1 and here.scrub()
    raw = place.raw()
    assert old.nonce.hex().encode() not in raw and old.nonce not in raw
    new = here.record("acme")
    assert new.nonce != old.nonce and new.nonce.hex().encode() in raw
    assert there.record("acme") == new and there.record("umbrella") == other  # the other proxy follows


def test_the_first_record_continues_an_older_versions_counter(place: Place) -> None:
    place.write_old_counter("acme", 3)
    epochs = Epochs(place.store(), interval_s=0.0)
    first = epochs.record("acme")
    assert first.epoch == 3 and epochs.record("umbrella").epoch == 0
    assert Salter(SECRET, epochs.record).salt("acme") not in {derivable_salt("acme", e) for e in range(5)}
    assert epochs.bump("acme") == 4 and epochs.record("acme").nonce != first.nonce


def test_a_store_failing_a_new_tenants_record_salts_it_with_this_process_nonce(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Flaky(DiskEpochStore):
        broken = True
        writes = 0

        def get_or_create(self, digest: str, nonce: bytes) -> TenantSalt:
            self.writes += 1
            if self.broken:
                raise OSError("disk full")
            return super().get_or_create(digest, nonce)

    store = Flaky(tmp_path / "tenants")
    epochs = Epochs(store, interval_s=3600)
    salter = Salter(SECRET, epochs.record)
    with caplog.at_level(logging.WARNING, logger="kvgate.salt"):
        acme, umbrella = salter.salt("acme"), salter.salt("umbrella")
    assert acme != umbrella and salter.salt("acme") == acme  # served, a salt per tenant, stable
    assert not {acme, umbrella} & {derivable_salt(t, 0) for t in TENANTS}
    assert store.writes == 1  # once the store failed, the next new tenant did not wait on it
    assert ["nonce write failed" in r.getMessage() for r in caplog.records] == [True]  # logged once
    other = Epochs(DiskEpochStore(tmp_path / "tenants"))  # another proxy makes umbrella's record meanwhile
    theirs = Salter(SECRET, other.record).salt("umbrella")
    store.broken, epochs.interval_s = False, 0.0
    assert salter.salt("acme") == acme  # the store took this process's nonce: no salt changed
    assert store.records([tenant_digest("acme")]) == {tenant_digest("acme"): epochs.record("acme")}
    assert salter.salt("umbrella") == theirs != umbrella  # the store's record won
    other.close()
    store.close()
