"""The routing benchmarks run end to end on tiny settings (figures are not asserted, shapes are)."""
from __future__ import annotations

import json
from pathlib import Path

from middleware.cli import main

TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "mooncake_conversation_trace.jsonl"


def test_routing_arena_tiny(tmp_path):
    out = tmp_path / "arena.json"
    rc = main(["bench", "routing", "--trace", str(TRACE), "--limit", "40", "--speed", "40", "--replicas", "2",
               "--capacity-tokens", "200000", "--policies", "round_robin,cache_aware,sglang", "--json", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["requests"] == 40 and 0 <= r["ceiling_lru"] <= r["ceiling_infinite"] <= 1
    for name in ("round_robin", "cache_aware", "sglang"):
        p = r["policies"][name]
        assert p["errors"] == 0 and p["completed"] == 40, p
        assert 0 <= p["hit_rate"] <= 1 and p["ttft_p50_s"] > 0 and sum(p["requests_per_replica"]) == 40
    # every request of this trace shares its first 512-token block: some prefix reuse must show
    assert r["policies"]["cache_aware"]["hit_rate"] > 0


def test_route_overhead_tiny(tmp_path):
    out = tmp_path / "ro.json"
    assert main(["bench", "route-overhead", "--indexed-blocks", "20000", "--samples", "20", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["indexed_blocks"] == 20000 and r["decision_p50_ms"] > 0 and r["chose_prefix_holder_fraction"] == 1.0
