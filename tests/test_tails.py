"""TailCache: the partial last chunk's KV, reused only after the same full chunks."""

from __future__ import annotations

import torch

from kvgate.engines.replica.tails import Tail, TailCache


def tail(tokens, layers=2):
    t = len(tokens)
    return Tail(
        tuple(tokens),
        tuple((torch.full((1, 3, t, 4), float(i)), torch.full((1, 3, t, 4), -float(i))) for i in range(layers)),
    )


def test_longest_shared_prefix_cut_to_limit():
    cache = TailCache(1 << 20)
    cache.put(7, tail([1, 2, 3, 4, 5]))
    cache.put(7, tail([1, 2, 9]))
    assert cache.best(8, [1, 2, 3], 10) is None  # another parent: never
    got = cache.best(7, [1, 2, 3, 4, 6, 6], 10)
    assert got.tokens == (1, 2, 3, 4) and got.layers[0][0].shape[2] == 4
    assert cache.best(7, [1, 2, 3, 4, 5], 3).tokens == (1, 2, 3)  # never past the limit
    assert cache.best(7, [5], 10) is None


def test_budget_and_siblings():
    one = tail(list(range(10))).nbytes
    cache = TailCache(3 * one)
    for p in range(5):
        cache.put(p, tail(list(range(10))))
    assert cache.stats()["tails"] == 3 and cache.best(0, list(range(10)), 20) is None
    for i in range(6):  # at most TAILS_PER_PARENT continuations of one prefix
        cache.put(99, tail([i] * 2))
    assert sum(1 for (p, _), _ in cache.snapshot() if p == 99) <= 4
    cache.clear()
    assert cache.stats()["bytes"] == 0
