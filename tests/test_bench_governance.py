"""`kvgate bench governance` at toy sizes: the JSON's shape, and that the tamper harness would see
a served forgery (its control against a store without encryption)."""
from __future__ import annotations

import json
from pathlib import Path

from kvgate.middleware.cli import main
from kvgate.tools.bench.governance_tamper import Tally, tamper_entries


def test_bench_governance_writes_the_issues_fields(tmp_path: Path) -> None:
    out = tmp_path / "governance.json"
    rc = main(["bench", "governance", "--parts", "encryption,tamper", "--chunks", "2", "--repeats", "1",
               "--rounds", "1", "--semantic-rounds", "1", "--semantic-queries", "4", "--tamper-per-way", "1",
               "--page-cache", "none", "--dir", str(tmp_path), "--json", str(out)])
    result = json.loads(out.read_text())
    enc, tamper = result["encryption"], result["tamper"]
    for key in ("disk_load_gbps_plain", "disk_load_gbps_encrypted", "hit_p50_ms_plain", "hit_p50_ms_encrypted",
                "hit_p99_ms_plain", "hit_p99_ms_encrypted"):
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
