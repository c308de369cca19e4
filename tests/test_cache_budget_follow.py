"""The response cache's byte budget, and handles on one directory seeing each other's writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvgate.index.responses.semantic import CacheEntry, SemanticIndex

DIM = 8


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def answer(i: int, size: int = 400) -> dict:
    return {"choices": [{"message": {"role": "assistant", "content": f"{i}:" + "x" * size}}]}


def disk_entries(index: SemanticIndex) -> int:
    return sum(1 for k in index.entries.cache.iterkeys() if isinstance(k, str) and k.startswith("e:"))


def test_byte_budget_evicts_oldest_and_survives_reopen(tmp_path: Path) -> None:
    budget = 10 * 800
    index = SemanticIndex(tmp_path, DIM, max_bytes=budget)
    for i in range(60):
        index.add("s", answer(i), exact_key=f"k{i}", text=f"q{i}", vector=unit(i))
        assert index.bytes <= budget
    assert index.evictions > 40 and 5 <= len(index) <= 16  # ~650 B each
    assert index.get_exact("k59") is not None and index.get_exact("k0") is None
    assert index.search("s", unit(59))[0][0].exact_key == "k59"
    held, count = index.bytes, len(index)
    assert disk_entries(index) == count
    index.close()

    again = SemanticIndex(tmp_path, DIM, max_bytes=budget)
    assert again.bytes == held and len(again) == count
    again.close()
    smaller = SemanticIndex(tmp_path, DIM, max_bytes=budget // 2)  # a lowered budget applies on open
    assert smaller.bytes <= budget // 2 and disk_entries(smaller) == len(smaller) < count
    smaller.close()


def test_one_large_answer_does_not_wedge_the_budget(tmp_path: Path) -> None:
    index = SemanticIndex(tmp_path, DIM, max_bytes=2000)
    index.add("s", answer(0, 5000), exact_key="big", vector=unit(0))  # alone over budget: evicted
    index.add("s", answer(1), exact_key="small", vector=unit(1))
    assert index.get_exact("big") is None and index.get_exact("small") is not None
    assert index.bytes <= 2000
    index.close()


def test_handles_on_one_directory_follow_each_other(tmp_path: Path) -> None:
    a = SemanticIndex(tmp_path, DIM, follow_interval_s=0)
    b = SemanticIndex(tmp_path, DIM, follow_interval_s=0)
    a.add("s", answer(1), exact_key="k1", text="q1", vector=unit(1))
    a.add("s", answer(2), exact_key="k2", text="q2")  # exact-only: counted, not searchable
    assert b.get_exact("k1") is not None  # the exact tier reads the shared disk directly
    found = b.search("s", unit(1))
    assert found and found[0][0].exact_key == "k1" and found[0][1] > 0.99
    assert len(a) == len(b) == disk_entries(a) == 2

    b.add("s", answer(3), exact_key="k1", text="q1", vector=unit(1))  # replaces a's entry for k1
    a.delete(a.get_exact("k2").id)  # type: ignore[union-attr]
    assert len(a) == len(b) == disk_entries(a) == 1
    assert a.bytes == b.bytes
    hit = a.search("s", unit(1))
    assert len(hit) == 1 and hit[0][0].response == answer(3)
    a.close()
    b.close()


def test_follower_waits_for_an_id_still_being_written(tmp_path: Path) -> None:
    a = SemanticIndex(tmp_path, DIM, follow_interval_s=0)
    b = SemanticIndex(tmp_path, DIM, follow_interval_s=0)
    (reserved,) = a.entries.allocate(1)  # a writer between allocating an id and storing it, seen from b
    assert b.catch_up() == 0 and len(b) == 0
    a.add("s", answer(9), exact_key="k9", vector=unit(9))
    assert len(b) == 1
    a.entries.put(CacheEntry(reserved, "s", answer(8), "k8"))
    assert len(b) == 2 and b.get_exact("k8") is not None
    a.close()
    b.close()
