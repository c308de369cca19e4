"""kvgate.index.responses.eviction.LruEviction as pure logic: LRU order, entry and byte budgets, expiry."""

from __future__ import annotations

import random

from kvgate.index.responses.eviction import LruEviction


def test_entry_budget_evicts_least_recently_used() -> None:
    ev = LruEviction(max_entries=3)
    for i in range(1, 4):
        ev.add(i, 10)
    assert ev.over_budget() == []
    ev.touch(1)  # 2 is now the least recently used
    ev.add(4, 10)
    assert ev.over_budget() == [2] and ev.evictions == 1
    assert len(ev) == 3 and 2 not in ev and ev.bytes == 30
    ev.touch(99)  # unknown ids are ignored
    assert len(ev) == 3


def test_byte_budget_and_one_oversized_entry() -> None:
    ev = LruEviction(max_bytes=100)
    ev.add(1, 40)
    ev.add(2, 40)
    ev.add(3, 40)
    assert ev.over_budget() == [1] and ev.bytes == 80
    ev.add(4, 500)  # alone over the budget: everything goes, itself last
    assert ev.over_budget() == [2, 3, 4] and ev.bytes == 0 and len(ev) == 0
    assert ev.evictions == 4


def test_re_adding_an_id_takes_its_new_size_and_place() -> None:
    ev = LruEviction(max_entries=2)
    ev.add(1, 10)
    ev.add(2, 10)
    ev.add(1, 25)
    assert ev.bytes == 35 and len(ev) == 2
    ev.add(3, 5)
    assert ev.over_budget() == [2]


def test_remove_and_no_budgets() -> None:
    ev = LruEviction()
    for i in range(1000):
        ev.add(i, 1000)
    assert ev.over_budget() == [] and ev.bytes == 10**6
    assert ev.remove(5) and not ev.remove(5) and ev.bytes == 10**6 - 1000
    assert ev.evictions == 0


def test_expiry_returns_due_tracked_ids_once_and_is_not_an_eviction() -> None:
    ev = LruEviction(max_entries=10)
    ev.add(1, 10, expires=100.0)
    ev.add(2, 10, expires=50.0)
    ev.add(3, 10)
    ev.add(4, 10, expires=60.0)
    ev.remove(4)  # deleted meanwhile: never reported
    assert ev.expired(now=40.0) == []
    assert ev.expired(now=100.0) == [2, 1]
    assert ev.expired(now=1e9) == [] and len(ev) == 1 and ev.bytes == 10 and ev.evictions == 0


def test_invariants_hold_under_random_operations() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        max_entries, max_bytes = rng.randint(1, 30), rng.randint(50, 3000)
        ev = LruEviction(max_entries, max_bytes)
        model: dict[int, int] = {}  # id → size, insertion = recency order
        for step in range(400):
            op = rng.random()
            if op < 0.6:
                entry_id, size = rng.randint(0, 60), rng.randint(1, 400)
                ev.add(entry_id, size)
                model.pop(entry_id, None)
                model[entry_id] = size
            elif op < 0.8 and model:
                entry_id = rng.choice(list(model))
                ev.touch(entry_id)
                model[entry_id] = model.pop(entry_id)
            elif model:
                entry_id = rng.choice(list(model))
                assert ev.remove(entry_id)
                del model[entry_id]
            for victim in ev.over_budget():
                assert victim == next(iter(model)), (seed, step)  # least recently used first
                del model[victim]
            assert len(ev) == len(model) <= max_entries and ev.bytes == sum(model.values()) <= max_bytes
