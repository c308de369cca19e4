"""Records.settle with a prompt's chain: it waits only for queued records whose chains start with
the prompt's first block (the only ones that can add to its match), on the real prefix index with
a recorder held back by a gate."""

from __future__ import annotations

import threading
from typing import Sequence

from kvgate.index.kv.prefix import PrefixIndex
from kvgate.middleware.routing.records import INLINE_RECORD_BLOCKS, Records, first_block
from kvgate.middleware.routing.state_local import LocalState


class GatedIndex(PrefixIndex):
    """The real index; the recorder thread's records wait for `gate`."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.gate = threading.Event()

    def record(self, replica: str, hashes: Sequence[int], parent: int | None = None) -> list[int]:
        if threading.current_thread().name.startswith("kvgate-index"):
            self.gate.wait(10)
        return super().record(replica, hashes, parent)


def chain(first: int) -> list[int]:
    """A chain long enough to be queued rather than applied inline."""
    return [first, *range(first * 1000 + 1, first * 1000 + INLINE_RECORD_BLOCKS + 2)]


def test_settle_waits_only_for_records_that_start_like_the_prompt() -> None:
    index = GatedIndex(100_000)
    for name in ("r0", "r1"):
        index.add_replica(name)
    records = Records(index, LocalState(["r0", "r1"]), deferred=True)
    try:
        records.record("r0", chain(1))
        records.record("r1", chain(2))
        assert not records.settle(0)  # both queued behind the gate
        assert records.settle(0, [3, 4, 5])  # starts otherwise: shares no block with either
        assert records.settle(0, [])  # a prompt with no full block has nothing to match
        assert not records.settle(0, [1, 7])  # starts like the first: waits, and the gate holds it
        assert not records.settle(0.01, [2])
        assert index.match([1]).get("r0", 0) == 0  # nothing applied while the gate is shut
        index.gate.set()
        assert records.settle(5, [1])
        assert index.match(chain(1)).get("r0") == len(chain(1)) and index.match(chain(2)).get("r1") == len(chain(2))
        index.gate.clear()
        records.record("r0", chain(3))  # queued behind the gate once more
        assert not records.settle(0, [3]) and records.settle(0, [1])  # the applied ones are counted out
    finally:
        index.gate.set()
        records.close()


def test_without_deferral_nothing_is_ever_queued() -> None:
    index = PrefixIndex(10_000)
    index.add_replica("r0")
    records = Records(index, LocalState(["r0"]), deferred=False)
    records.record("r0", chain(1))
    assert records.settle(0) and records.settle(0, [1])


def test_first_block() -> None:
    assert first_block([5, 6]) == 5 and first_block([]) is None
