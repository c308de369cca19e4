"""`kvgate bench route-fresh` runs both arms on the packaged tokenizer, and every lead prompt
completes to the hashes and token count of an eager hashing (the bench fails otherwise)."""

from __future__ import annotations

import argparse
import json

import pytest

from kvgate.tools.bench import route_fresh


def args(tmp_path, **over):
    ns = argparse.Namespace(
        tokens="300,3000", samples=2, tokenizer="smollm2", block_size=16, replicas=2, indexed_blocks=2000,
        json=tmp_path / "fresh.json", mode="approximate",
    )  # fmt: skip
    for k, v in over.items():
        setattr(ns, k, v)
    return ns


@pytest.mark.parametrize("mode", ["approximate", "precise"])
def test_route_fresh_reports_both_arms_per_length(tmp_path, mode):
    assert route_fresh.main(args(tmp_path, mode=mode)) == 0
    out = json.loads((tmp_path / "fresh.json").read_text())
    assert out["lead_hash_mismatches"] == 0 and [r["tokens"] > 0 for r in out["rows"]] == [True, True]
    assert out["rows"][0]["tokens"] < out["rows"][1]["tokens"]
    for row in out["rows"]:
        for arm in ("lead", "whole"):
            assert row[arm]["decide_p50_ms"] > 0 and row[arm]["total_mean_ms"] >= row[arm]["decide_mean_ms"]


def test_route_fresh_refuses_bad_lengths(tmp_path):
    with pytest.raises(SystemExit, match="positive integers"):
        route_fresh.main(args(tmp_path, tokens="10,x"))
