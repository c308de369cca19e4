"""BlockCounts and the loops' `tally` under it: the C count over the native table gives what the
Python count over a dict gives, and a block leaves when the last chain holding it is dropped."""

from __future__ import annotations

import random

import pytest

from kvgate.index.kv.block_counts import BlockCounts
from kvgate.index.kv.prefix_loops import loops, python_loops

PY = python_loops()


def test_a_block_leaves_with_the_last_chain_holding_it() -> None:
    for mod in {PY, loops()}:
        counts = BlockCounts(mod)
        counts.add([1, 2, 3])
        counts.add([1, 2, 4])
        assert len(counts) == 4 and 3 in counts
        assert counts.drop([1, 2, 3]) == [3]
        assert counts.drop([9]) == []  # never counted: nothing to drop
        assert counts.drop([1, 2, 4]) == [1, 2, 4]
        assert len(counts) == 0 and 1 not in counts


@pytest.mark.parametrize("seed", range(10))
def test_the_c_count_is_the_python_count(seed: int) -> None:
    native = loops()
    if native is PY:
        pytest.skip("the C loops were not built")
    rng = random.Random(seed)
    pool = [rng.getrandbits(64) for _ in range(300)]
    chains = [[rng.choice(pool) for _ in range(rng.randrange(60))] for _ in range(30)]
    a, b = {}, native.U64Map()
    held: list[list[int]] = []
    for _ in range(400):
        if held and rng.random() < 0.45:
            chain = held.pop(rng.randrange(len(held)))
            assert PY.tally(a, chain, False) == native.tally(b, chain, False)
        else:
            chain = rng.choice(chains)
            held.append(chain)
            assert PY.tally(a, chain, True) == native.tally(b, tuple(chain), True) == []
        assert dict(b.items()) == a
    with pytest.raises(TypeError):
        native.tally({}, [1], True)  # the C count runs on its own table only
    with pytest.raises(OverflowError):
        native.tally(b, [-1], True)
