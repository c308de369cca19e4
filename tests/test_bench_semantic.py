"""`kvgate bench semantic` end to end on tiny inputs: both modes, input validation, the GPTCache mapping."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kvgate.middleware.cli import main
from kvgate.tools.bench.gptcache_anchor import gptcache_threshold, require_gptcache
from kvgate.tools.bench.proxy_latency import SEED_QUESTIONS


def _write_pairs(path: Path) -> tuple[int, int]:
    """40 usable pairs (30 duplicates, 10 not) plus one row with an empty question."""
    rows = [(seed, para, 1) for seed, para, _ in SEED_QUESTIONS[:30]]
    # not duplicates: question2 paraphrases an earlier pair's question1, so a hit there is wrong
    rows += [(SEED_QUESTIONS[30 + k][0], SEED_QUESTIONS[k][2], 0) for k in range(10)]
    rows.insert(5, ("", "an empty question1 is skipped", 0))
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["question1", "question2", "is_duplicate"])
        writer.writerows(rows)
    return 40, 30


def test_pairs_mode_reports_consistent_figures(tmp_path: Path) -> None:
    pairs_file = tmp_path / "pairs.csv"
    n, dups = _write_pairs(pairs_file)
    out = tmp_path / "deep" / "out.json"
    assert (
        main(
            [
                "bench",
                "semantic",
                "--pairs",
                str(pairs_file),
                "--threshold",
                "0.8",
                "--latency-queries",
                "10",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    for key in (
        "mode",
        "pairs_file",
        "pairs",
        "duplicates",
        "threshold",
        "precision",
        "recall",
        "hits",
        "correct_hits",
        "lookup_p50_ms",
        "lookup_p99_ms",
        "sweep",
        "gptcache",
        "machine",
        "notes",
    ):
        assert key in data, key
    assert data["mode"] == "pairs" and data["pairs"] == n and data["duplicates"] == dups
    assert data["skipped_rows"] == 1
    assert 0 < data["hits"] <= data["pairs"]
    assert data["correct_hits"] <= data["hits"]
    assert 0.0 <= data["precision"] <= 1.0 and 0.0 <= data["recall"] <= 1.0
    assert data["precision"] == pytest.approx(data["correct_hits"] / data["hits"], abs=1e-4)
    assert data["recall"] == pytest.approx(data["correct_hits"] / dups, abs=1e-4)
    assert data["precision"] < 1.0  # the non-duplicates paraphrase another pair's question1
    assert data["lookup_p50_ms"] > 0 and data["lookup_p99_ms"] >= data["lookup_p50_ms"]
    assert data["latency_queries"] == 10
    assert data["machine"]["cpu_count"] >= 1

    hits = [s["hits"] for s in data["sweep"]]
    assert hits == sorted(hits, reverse=True)  # a higher threshold never adds hits
    at_threshold = next(s for s in data["sweep"] if s["threshold"] == 0.8)
    assert at_threshold["hits"] == data["hits"]

    anchor = data["gptcache"]
    if require_gptcache() is not None:
        assert "skipped" in anchor
        return
    assert anchor["pairs"] == n and anchor["threshold"] == 0.8
    assert anchor["gptcache_similarity_threshold"] == pytest.approx(0.9)
    assert 0 <= anchor["hits"] <= n and 0.0 <= anchor["precision"] <= 1.0
    assert anchor["lookup_p50_ms"] > 0 and anchor["latency_queries"] == 10
    # same vectors, exact search on both sides, equivalent thresholds: the same answers
    assert anchor["same_answer_as_kvgate"] == n
    assert (anchor["hits"], anchor["correct_hits"]) == (data["hits"], data["correct_hits"])
    assert anchor["settings"]["embedding_calls_real"] >= 10  # the latency pass embedded for real


def test_entries_mode_times_real_hits(tmp_path: Path) -> None:
    out = tmp_path / "proxy.json"
    assert (
        main(["bench", "semantic", "--entries", "2000", "--queries", "20", "--filler", "random", "--json", str(out)])
        == 0
    )
    data = json.loads(out.read_text())
    assert data["filler"] == "random"
    for key in (
        "exact_hit_p50_ms",
        "exact_hit_p99_ms",
        "semantic_hit_p50_ms",
        "semantic_hit_p99_ms",
        "entries",
        "index_kind",
        "miss_p50_ms",
        "backend_direct_p50_ms",
        "machine",
        "notes",
    ):
        assert key in data, key
    assert data["mode"] == "proxy" and data["entries"] == 2000 and data["index_kind"] == "flat"
    assert data["scope_entries"] > 2000
    assert data["exact_hits"] == data["exact_requests"] == 20
    assert 0 < data["semantic_hits"] <= data["semantic_requests"] == 20
    assert data["semantic_hits_correct"] == data["semantic_hits"]
    assert data["semantic_similarity_min"] >= data["threshold"]
    assert data["seed_misses"] == data["seeded"]
    assert 0 < data["exact_hit_p50_ms"] <= data["exact_hit_p99_ms"]
    assert 0 < data["semantic_hit_p50_ms"] <= data["semantic_hit_p99_ms"]


NOUNS = (
    "bicycle",
    "violin",
    "bonsai tree",
    "parrot",
    "laptop",
    "canoe",
    "sourdough loaf",
    "wool sweater",
    "leather jacket",
    "chess set",
    "telescope",
    "aquarium",
    "lawn mower",
    "espresso machine",
    "hammock",
    "kayak",
    "piano",
    "snowboard",
    "tent",
    "vinyl record",
    "watercolor set",
    "drone",
    "hedgehog",
    "orchid",
    "cast iron pan",
    "skateboard",
    "microscope",
    "ukulele",
    "beehive",
    "sewing machine",
    "rowing machine",
    "fountain pen",
    "bread maker",
    "greenhouse",
    "tortoise",
    "sailboat",
    "trumpet",
    "compost bin",
    "3D printer",
    "harmonica",
)


def _write_filler_sources(tmp_path: Path) -> tuple[Path, Path]:
    """A small QQP-format CSV (duplicates and near-miss non-duplicates) and a mock-pairs JSON."""
    pairs = tmp_path / "qqp.csv"
    with pairs.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["question1", "question2", "is_duplicate"])
        for noun in NOUNS:
            writer.writerow([f"How do I take care of a {noun}?", f"What is the best way to look after a {noun}?", 1])
            writer.writerow([f"How much does a {noun} cost?", f"How much does a {noun} weigh?", 0])
    positives = tmp_path / "mock.json"
    positives.write_text(
        json.dumps(
            [
                {
                    "origin": f"Where can I rent a {n} for a weekend?",
                    "similar": f"Is there a place to hire a {n} for two days?",
                }
                for n in NOUNS
            ]
        )
    )
    return pairs, positives


def test_entries_mode_real_filler_is_embedded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_BENCH_CACHE", str(tmp_path / "embeddings"))
    pairs, positives = _write_filler_sources(tmp_path)
    args = [
        "bench",
        "semantic",
        "--entries",
        "400",
        "--queries",
        "12",
        "--filler-pairs",
        str(pairs),
        "--filler-positives",
        str(positives),
    ]
    assert main([*args, "--json", str(tmp_path / "first.json")]) == 0
    first = json.loads((tmp_path / "first.json").read_text())
    assert first["filler"] == "real" and first["entries"] == 400 and first["index_kind"] == "flat"
    assert first["filler_cache"]["state"] == "miss" and first["filler_cache"]["parts_embedded"] == 1
    sources = first["filler_sources"]
    assert sources["filler_questions"] + sources["filler_variants"] == 400 and sources["filler_variants"] > 0
    assert first["exact_hits"] == first["exact_requests"] == 12
    kinds = first["semantic_by_kind"]
    assert "seed" in kinds and set(kinds) <= {"seed", "paraphrase", "unrelated"}
    assert sum(k["requests"] for k in kinds.values()) == first["semantic_requests"] == 12
    assert first["semantic_hits_correct"] <= first["semantic_hits"] == sum(k["hits"] for k in kinds.values())
    assert first["semantic_hits"] < 12 or first["semantic_miss_p50_ms"] is None
    assert 0 < first["exact_hit_p50_ms"] and first["backend_direct_p50_ms"] > 0

    assert main([*args, "--json", str(tmp_path / "second.json")]) == 0  # the embeddings come from disk
    second = json.loads((tmp_path / "second.json").read_text())
    assert second["filler_cache"]["state"] == "hit" and second["filler_cache"]["embed_s"] == 0
    assert second["semantic_by_kind"] == kinds  # same texts, same vectors: the same answers


def test_real_filler_texts_are_distinct_stable_and_keep_queries_out(tmp_path: Path) -> None:
    from kvgate.tools.bench.semantic_filler import filler_answer, filler_base, load_real_filler, variant

    pairs, positives = _write_filler_sources(tmp_path)
    filler = load_real_filler(pairs, positives)
    texts = filler.texts(500)
    assert [t.text for t in filler.texts(300)] == [t.text for t in texts[:300]]  # a prefix for every size
    assert len({t.text for t in texts}) == 500
    queries = {q.text for q in filler.paraphrases + filler.unrelated}
    assert queries and not queries & {t.text for t in texts}
    assert all(filler.bases[q.expected] not in queries for q in filler.paraphrases)
    assert variant("How do I take care of a bicycle?", 3) == variant("How do I take care of a bicycle?", 3)
    assert filler_base(filler_answer(17)) == 17 and filler_base("Answer 3: hi") is None
    assert load_real_filler(pairs, positives).digest == filler.digest


def test_bad_inputs_are_reported_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "semantic", "--pairs", str(tmp_path / "nope.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err

    bad = tmp_path / "bad.csv"
    bad.write_text("question1,answer\nhello,world\n")
    assert main(["bench", "semantic", "--pairs", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "missing column(s) question2, is_duplicate" in err

    flags = tmp_path / "flags.csv"
    flags.write_text("question1,question2,is_duplicate\na,b,maybe\n")
    assert main(["bench", "semantic", "--pairs", str(flags)]) == 2
    assert "is_duplicate must be 0 or 1" in capsys.readouterr().err

    assert main(["bench", "semantic", "--entries", "10", "--limit", "5"]) == 2
    assert "--limit only applies" in capsys.readouterr().err
    assert main(["bench", "semantic", "--entries", "10", "--filler-pairs", str(tmp_path / "none.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["bench", "semantic", "--entries", "10", "--filler", "random", "--filler-pairs", str(bad)]) == 2
    assert "only apply to --filler real" in capsys.readouterr().err
    assert main(["bench", "semantic", "--pairs", str(bad), "--filler", "random"]) == 2
    assert "--filler only applies to the other mode" in capsys.readouterr().err

    with pytest.raises(SystemExit) as both:
        main(["bench", "semantic", "--pairs", str(bad), "--entries", "10"])
    assert both.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "semantic"])
    assert "one of the arguments --pairs --entries is required" in capsys.readouterr().err


def test_gptcache_threshold_matches_cosine() -> None:
    # squared L2 on unit vectors: d = 2 - 2cos; hit when d <= 4 * (1 - s)
    for cosine in (0.0, 0.5, 0.8, 0.9, 1.0):
        s = gptcache_threshold(cosine)
        assert 4.0 * (1.0 - s) == pytest.approx(2.0 - 2.0 * cosine)
    assert gptcache_threshold(0.9) == pytest.approx(0.95)
    with pytest.raises(ValueError):
        gptcache_threshold(1.5)


def test_stages_mode_times_both_caches_stage_by_stage(tmp_path: Path) -> None:
    if require_gptcache() is not None:
        pytest.skip("--stages needs GPTCache")
    pairs_file = tmp_path / "pairs.csv"
    n, _ = _write_pairs(pairs_file)
    out = tmp_path / "stages.json"
    assert (
        main(
            [
                "bench",
                "semantic",
                "--pairs",
                str(pairs_file),
                "--stages",
                "--threshold",
                "0.8",
                "--latency-queries",
                "6",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    assert data["mode"] == "stages" and data["pairs"] == n and data["latency_queries"] == 6
    ours, theirs = data["kvgate"], data["gptcache"]
    for name in ("embed", "faiss_search", "entry_read", "request_id_write"):
        assert ours[name]["mean_ms"] > 0, name
    for name in ("embedding", "search", "get_data", "sqlite_selects", "sqlite_update_commit"):
        assert theirs[name]["mean_ms"] > 0, name
    # means add up: a lookup is its stages (the differences are defined that way)
    assert ours["lookup"]["mean_ms"] == pytest.approx(ours["embed"]["mean_ms"] + ours["search"]["mean_ms"], abs=1e-3)
    stages = ("pre_process", "embedding", "search", "get_data", "evaluation", "post_process", "other")
    assert theirs["lookup"]["mean_ms"] == pytest.approx(sum(theirs[s]["mean_ms"] for s in stages), abs=1e-3)
    assert data["hits"]["kvgate"] == data["hits"]["gptcache"]  # same vectors, equivalent thresholds
    assert data["journal_mode"]["kvgate_diskcache"] == "wal"


def test_stages_option_belongs_to_pairs_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "semantic", "--entries", "10", "--stages"]) == 2
    assert "--stages only apply to --pairs" in capsys.readouterr().err
    pairs_file = tmp_path / "pairs.csv"
    _write_pairs(pairs_file)
    assert main(["bench", "semantic", "--pairs", str(pairs_file), "--stages", "--holdout"]) == 2
    assert "--stages times lookups" in capsys.readouterr().err


def test_stage_summary_means_are_additive() -> None:
    from kvgate.tools.bench.semantic.stages import stage_summary

    got = stage_summary({"a": [0.001, 0.003], "b": [0.002, 0.002], "empty": []})
    assert got == {"a": {"mean_ms": 2.0, "p50_ms": 2.0}, "b": {"mean_ms": 2.0, "p50_ms": 2.0}}
