"""SemanticIndex on real FAISS and diskcache, with real embeddings where meaning matters."""

from __future__ import annotations

import time

import numpy as np

from kvgate.index.responses.semantic import SemanticIndex
from kvgate.index.responses.vectors import ScopeVectors


def unit(rng, n, dim=384):
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def resp(text):
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


def test_add_search_delete_with_real_embeddings(tmp_path, embedder):
    idx = SemanticIndex(tmp_path, embedder.dim)
    qs = ["What is the capital of France?", "How do I bake bread?", "Who wrote Hamlet?"]
    vecs = embedder.embed(qs)
    entries = [idx.add("s1", resp(q), exact_key=f"k{i}", text=q, vector=v) for i, (q, v) in enumerate(zip(qs, vecs))]
    ((found, sim),) = idx.search("s1", embedder.embed(["Tell me the capital city of France"])[0], k=1)
    assert found.id == entries[0].id and sim > 0.9
    assert idx.search("other-scope", vecs[0], k=1) == []
    assert idx.get_exact("k1").text == qs[1]
    assert idx.delete(entries[0].id)
    assert idx.get_exact("k0") is None
    assert all(e.id != entries[0].id for e, _ in idx.search("s1", vecs[0], k=3))
    idx.close()


def test_ttl_lru_and_restart(tmp_path):
    rng = np.random.default_rng(0)
    v = unit(rng, 6)
    idx = SemanticIndex(tmp_path, 384, max_entries=3)
    short = idx.add("s", resp("short"), exact_key="short", vector=v[0], ttl=0.5)
    ids = [idx.add("s", resp(f"a{i}"), exact_key=f"a{i}", vector=v[i + 1]).id for i in range(3)]
    assert idx.get_exact("short") is None  # evicted: 4 entries > max 3, it was the oldest
    assert idx.evictions == 1
    idx.get_exact("a0")  # touch: a1 is now least recently used
    idx.add("s", resp("a3"), exact_key="a3", vector=v[4])
    assert idx.get_exact("a1") is None and idx.get_exact("a0") is not None
    ttl_entry = idx.add("s", resp("t"), exact_key="t", vector=v[5], ttl=0.5)
    time.sleep(0.7)
    assert idx.get_exact("t") is None
    assert all(e.id != ttl_entry.id for e, _ in idx.search("s", v[5], k=3))
    idx.close()

    again = SemanticIndex(tmp_path, 384, max_entries=3)
    assert len(again) == 2 and again.get_exact("a0").id == ids[0]
    ((found, sim),) = again.search("s", v[4], k=1)
    assert found.response == resp("a3") and sim > 0.99
    assert short.id not in {e.id for e, _ in again.search("s", v[0], k=5)}
    again.close()


def test_same_exact_key_replaces_entry(tmp_path):
    rng = np.random.default_rng(1)
    v = unit(rng, 2)
    idx = SemanticIndex(tmp_path, 384)
    old = idx.add("s", resp("old"), exact_key="k", vector=v[0])
    new = idx.add("s", resp("new"), exact_key="k", vector=v[1])
    assert idx.get_exact("k").id == new.id and len(idx) == 1
    assert all(e.id != old.id for e, _ in idx.search("s", v[0], k=2))


def test_damaged_entry_is_a_miss(tmp_path):
    idx = SemanticIndex(tmp_path, 384)
    e = idx.add("s", resp("x"), exact_key="k", vector=unit(np.random.default_rng(2), 1)[0])
    idx.entries.cache.set(f"e:{e.id}", b"\x00garbage")  # sealed, but not an entry
    assert idx.get_exact("k") is None and len(idx) == 0


def test_scope_switches_to_hnsw_and_stays_accurate():
    rng = np.random.default_rng(3)
    x = unit(rng, 3000, 64)
    sv = ScopeVectors(64, hnsw_above=1000)
    sv.add(np.arange(3000), x)
    assert sv.kind == "hnsw"
    queries = x[:200] + 0.05 * unit(rng, 200, 64)
    recall = np.mean([sv.search(q, 1)[0][0] == i for i, q in enumerate(queries)])
    assert recall > 0.98
    sv.remove(list(range(100)))
    assert len(sv) == 2900 and all(sv.search(x[i], 1)[0][0] != i for i in range(100))
    sv.remove(list(range(100, 1000)))  # past a quarter dead: compacted
    assert len(sv) == 2000 and sv.search(x[2500], 1)[0][0] == 2500


def test_bulk_add(tmp_path):
    idx = SemanticIndex(tmp_path, 384)
    v = unit(np.random.default_rng(4), 50)
    idx.add_many_vectors("s", [(resp(str(i)), str(i), v[i]) for i in range(50)])
    ((e, sim),) = idx.search("s", v[17], k=1)
    assert e.text == "17" and sim > 0.99 and len(idx) == 50
