"""Feedback building blocks without servers: floors (kvgate.index.responses.tighten), SemanticIndex.tighten, DiskRequestLog."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kvgate.index.responses.semantic import SemanticIndex
from kvgate.index.responses.tighten import (
    Mark,
    decode_marks,
    encode_marks,
    floor_from_marks,
    raise_floor,
    threshold_for,
)
from kvgate.middleware.cache.feedback import give_feedback
from kvgate.middleware.cache.request_log import DiskRequestLog, RequestRecord, new_request_id
from kvgate.middleware.errors import RequestNotFound
from kvgate.middleware.telemetry.metrics import Metrics

DIM = 8


def unit(*xs: float) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(xs)] = xs
    return v / np.linalg.norm(v)


def response(text: str) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


def test_floors_only_rise_and_cap_at_one() -> None:
    assert raise_floor(None, 0.9) == 0.9 and raise_floor(0.95, 0.9) == 0.95 and raise_floor(0.9, None) == 0.9
    center = unit(1, 0)
    marks = [Mark(center, 0.8), Mark(center, 0.995)]
    assert floor_from_marks(center, marks, margin=0.01) == 1.0  # min(0.995 + 0.01, 1.0)
    far = unit(0, 1)  # cos 0 to the centre: outside both regions
    assert floor_from_marks(far, marks, margin=0.01) is None
    mid = unit(1, 0.5)  # cos ≈ 0.894: inside the 0.8 region only
    assert floor_from_marks(mid, marks, margin=0.01) == pytest.approx(0.81)
    assert threshold_for(0.9, None) == 0.9 and threshold_for(0.9, 0.95) == 0.95 and threshold_for(0.9, 0.5) == 0.9


def test_marks_round_trip_as_json() -> None:
    marks = [Mark(unit(1, 2, 3), 0.93, 12.5)]
    back = decode_marks(encode_marks(marks), DIM)
    assert len(back) == 1 and back[0].similarity == 0.93 and np.allclose(back[0].center, marks[0].center)
    assert decode_marks(encode_marks(marks), DIM + 1) == []  # another dimension: ignored


def test_tighten_raises_neighbours_and_later_entries(tmp_path) -> None:
    index = SemanticIndex(tmp_path / "r", DIM, tighten_margin=0.01)
    wrong = index.add("s", response("a"), text="a", vector=unit(1, 0))
    near = index.add("s", response("b"), text="b", vector=unit(1, 0.1))  # cos ≈ 0.995 to `wrong`
    far = index.add("s", response("c"), text="c", vector=unit(0, 1))
    other_scope = index.add("t", response("d"), text="d", vector=unit(1, 0))
    center = index.vector(wrong.id)
    assert index.delete(wrong.id)
    assert index.tighten("s", center, 0.93) == 1
    assert index.get(near.id).min_similarity == pytest.approx(0.94)
    assert index.get(far.id).min_similarity is None
    assert index.get(other_scope.id).min_similarity is None
    # an answer stored later in the region inherits the floor; outside it does not
    again = index.add("s", response("a2"), text="a", vector=unit(1, 0))
    elsewhere = index.add("s", response("e"), text="e", vector=unit(0, 0, 1))
    assert again.min_similarity == pytest.approx(0.94) and elsewhere.min_similarity is None
    index.close()
    # floors and marks are on disk: a new handle (restart, another process) sees them
    reopened = SemanticIndex(tmp_path / "r", DIM, tighten_margin=0.01)
    assert reopened.get(near.id).min_similarity == pytest.approx(0.94)
    assert len(reopened.marks("s")) == 1
    hits = reopened.search("s", unit(1, 0), k=1)
    assert hits[0][0].id == again.id and hits[0][0].min_similarity == pytest.approx(0.94)
    reopened.close()


def test_marks_per_scope_are_bounded(tmp_path) -> None:
    index = SemanticIndex(tmp_path / "r", DIM, max_marks_per_scope=3)
    for k in range(5):
        index.tighten("s", unit(1, k), 0.9)
    assert len(index.marks("s")) == 3
    index.close()


def test_request_log_expires_and_is_shared(tmp_path) -> None:
    log = DiskRequestLog(tmp_path / "q", ttl=0.3, max_bytes=2**20)
    rid = new_request_id()
    log.record(rid, RequestRecord("t", "chat", "semantic", "scope", 7, 0.93))
    other = DiskRequestLog(tmp_path / "q", ttl=0.3, max_bytes=2**20)  # a second process on the same dir
    assert other.get(rid) == log.get(rid) and other.get(rid).entry_id == 7
    assert log.get("not-an-id") is None and log.get(new_request_id()) is None
    time.sleep(0.4)
    assert log.get(rid) is None
    log.close()
    other.close()


def test_request_log_is_size_bounded(tmp_path) -> None:
    log = DiskRequestLog(tmp_path / "q", ttl=3600, max_bytes=200_000)
    for _ in range(5000):
        log.record(new_request_id(), RequestRecord("t" * 50, "chat", "miss", "s" * 64, 1))
    assert len(log) < 5000  # culled, oldest first
    log.close()


def test_give_feedback_rules(tmp_path) -> None:
    index = SemanticIndex(tmp_path / "r", DIM)
    log = DiskRequestLog(tmp_path / "q", ttl=3600, max_bytes=2**20)
    metrics = Metrics()
    served = index.add("s", response("a"), text="a", vector=unit(1, 0))
    rid = new_request_id()
    log.record(rid, RequestRecord("tenant-a", "chat", "semantic", "s", served.id, 0.92))
    with pytest.raises(RequestNotFound):
        give_feedback(index, log, metrics, rid, False, "tenant-b")  # not yours: as if unknown
    assert index.get(served.id) is not None
    assert give_feedback(index, log, metrics, rid, True, "tenant-a").removed is False
    out = give_feedback(index, log, metrics, rid, False, "tenant-a")
    assert out.removed and out.tier == "semantic" and index.get(served.id) is None
    assert len(index.marks("s")) == 1
    again = give_feedback(index, log, metrics, rid, False, "tenant-a")  # idempotent
    assert not again.removed and again.tightened == 0
    text = metrics.render().decode()
    assert 'kvgate_cache_feedback_total{route="chat",tier="semantic",verdict="wrong"} 2.0' in text
    assert 'kvgate_feedback_entries_removed_total{route="chat"} 1.0' in text
    index.close()
    log.close()


def test_a_request_record_reads_back_whole() -> None:
    """Every field of a record survives its stored form, hit or miss."""
    from dataclasses import asdict

    for record in (
        RequestRecord("t", "chat", "semantic", "s", 7, 0.93125),
        RequestRecord("t", "chat", "miss", "s", None),
    ):
        back = RequestRecord.from_bytes(record.to_bytes())
        assert back == record and asdict(back) == asdict(record)
