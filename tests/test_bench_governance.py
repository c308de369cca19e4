"""`kvgate bench governance` at toy sizes: the JSON's shape, that the tamper harness would see
a served forgery (its control against a store without encryption), and the erase and invalidate
parts against real Redis, disk and `kvgate serve` processes with fake vLLM-shaped engines (the
bench itself runs them against real vLLM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.middleware.cli import main
from kvgate.tools.bench.governance_tamper import Tally, tamper_entries


def test_bench_governance_writes_the_issues_fields(tmp_path: Path) -> None:
    out = tmp_path / "governance.json"
    rc = main(
        [
            "bench",
            "governance",
            "--parts",
            "encryption,tamper",
            "--chunks",
            "2",
            "--repeats",
            "1",
            "--rounds",
            "1",
            "--semantic-rounds",
            "1",
            "--semantic-queries",
            "4",
            "--tamper-per-way",
            "1",
            "--page-cache",
            "none",
            "--dir",
            str(tmp_path),
            "--json",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    enc, tamper = result["encryption"], result["tamper"]
    for key in (
        "disk_load_gbps_plain",
        "disk_load_gbps_encrypted",
        "hit_p50_ms_plain",
        "hit_p50_ms_encrypted",
        "hit_p99_ms_plain",
        "hit_p99_ms_encrypted",
    ):
        assert enc[key] > 0, key
    assert enc["bytes_per_token_encrypted"] > enc["bytes_per_token_plain"] and enc["decrypt_failures"] == 0
    assert enc["errors"] == 0 and enc["hits"]["encrypted"] > 0 and enc["semantic_hits"]["encrypted"] > 0
    assert tamper["tried"] >= 10 and tamper["served"] == 0 and tamper["errors"] == 0
    assert result["erase"] is None and result["invalidate"] is None
    assert rc in (0, 1)  # 1: a ratio goal missed at toy sizes on a busy machine; the tamper goal held above


def test_tamper_control_without_encryption_serves_forgeries(tmp_path: Path, embedder) -> None:
    tally = Tally()
    tamper_entries(tmp_path, "disk", embedder, tally, per_way=1, encrypted=False)
    rows = tally.report()["by_way"]
    assert rows["entries-disk:plaintext"]["served"] == 1  # what encryption stops
    assert rows["entries-disk:flip"]["served"] == 0  # the checksum alone catches a crude flip


@pytest.mark.slow
def test_bench_governance_erase_and_invalidate_with_fake_engines(tmp_path: Path) -> None:
    out = tmp_path / "governance.json"
    rc = main(
        [
            "bench",
            "governance",
            "--parts",
            "erase,invalidate",
            "--engine",
            "fake",
            "--tenant-docs",
            "1",
            "--invalidate-docs",
            "1",
            "--dir",
            str(tmp_path),
            "--json",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    erase, invalidate = result["erase"], result["invalidate"]
    assert result["encryption"] is None and result["tamper"] is None
    # the scan finds the tenant's canary before (its tag, kept in the clear in index keys), none after
    assert erase["plaintext_found_before"] > 0 and erase["plaintext_found"] == 0
    assert erase["readable_after"] == {"entries": 0, "chunks_new_salt": 0, "chunks_derived_salt": 0}
    nonces = erase["salt_records"]  # the old nonces were in the stores before, overwritten by the erasure
    assert nonces["old_nonce_found_before"] > 0 and nonces["old_nonce_found_after"] == 0
    assert nonces["records_after"] == {"disk": 1, "redis": 1} and nonces["salts_derived_after"] >= 4
    assert erase["next_request_miss"] and erase["next_request"]["cached_tokens"] == 0
    assert erase["other_tenant_hit_ratio"] == 1.0 and erase["other_tenant"]["before"]["hits"] > 0
    layers = erase["counts_per_layer"]
    for store in ("response_disk", "response_redis"):
        layer = layers[store]
        assert layer["tenant_entries_before"] > 0 and layer["tenant_entries_after"] == 0, store
        assert layer["other_tenant_entries_after"] == layer["other_tenant_entries_before"] > 0, store
        assert layer["salt_epoch"] == 1 and layer["scrubbed"] is True, store
    assert layers["kv_disk"] is None and erase["next_request"]["tier_loaded_chunks"] is None  # no tiers here
    for kind in ("by_tag", "by_system_prompt", "by_revision"):
        row = invalidate[kind]
        assert row["hits_before"] == row["replayed"] > 0, kind
        assert row["stale_served"] == 0 and row["fresh_hits_again"] == row["replayed"], kind
    assert invalidate["by_tag"]["other_tag_kept_hits"] == invalidate["by_tag"]["replayed"]
    assert invalidate["by_revision"]["roots_after"] != invalidate["by_revision"]["roots_before"]
    assert all(erase["goals"].values()) and all(invalidate["goals"].values()) and rc == 0
