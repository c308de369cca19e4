"""Group commit of inline record steps (kvgate.middleware.cache.group_commit), the stores' write batches
(`batch()`, kvgate.index.storage.softfail.soft_transaction) and ids reserved in blocks (kvgate.index.responses.id_blocks)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3

import numpy as np
import pytest

from kvgate.index.responses.entries.disk import DiskEntryStore
from kvgate.index.responses.id_blocks import IdBlocks
from kvgate.index.responses.semantic import SemanticIndex
from kvgate.index.storage.softfail import Batch, SoftFailures, soft_transaction
from kvgate.middleware.cache.group_commit import GroupCommit
from kvgate.middleware.cache.request_log import DiskRequestLog, RequestRecord, new_request_id

DIM = 8


class Batches:
    """A batch context noting when batches open and close."""

    def __init__(self, lose: bool = False) -> None:
        self.events: list[str] = []
        self.lose = lose

    @contextlib.contextmanager
    def __call__(self):
        self.events.append("begin")
        batch = Batch()
        yield batch
        batch.lost = self.lose  # as soft_transaction does when the commit fails
        self.events.append("commit")


def test_steps_of_one_loop_turn_run_in_one_batch_in_order():
    batches = Batches()
    commits = GroupCommit(batches)
    ran: list[int] = []

    async def main() -> None:
        await asyncio.gather(*(commits.run(ran.append, i) for i in range(5)))
        assert batches.events == ["begin", "commit"] and ran == [0, 1, 2, 3, 4]
        await commits.run(ran.append, 5)  # a later turn: a batch of its own

    asyncio.run(main())
    assert batches.events == ["begin", "commit"] * 2 and ran == [0, 1, 2, 3, 4, 5]
    assert (commits.batches, commits.steps) == (2, 6)


def _turns_until(done: "asyncio.Future[None]") -> "asyncio.Future[int]":
    """How many loop turns pass until `done` is resolved (a callback that re-arms itself each turn)."""
    loop = asyncio.get_running_loop()
    counted: asyncio.Future[int] = loop.create_future()

    def tick(n: int) -> None:
        if done.done():
            counted.set_result(n)
        else:
            loop.call_soon(tick, n + 1)

    loop.call_soon(tick, 1)
    return counted


def test_a_lone_step_runs_at_the_next_turn():
    """An idle proxy's step waits for no one: its batch runs at the next turn's start."""
    batches = Batches()
    commits = GroupCommit(batches)

    async def main() -> int:
        step = asyncio.ensure_future(commits.run(lambda: None))
        turns = await _turns_until(step)
        await step
        return turns

    assert asyncio.run(main()) <= 3  # the step's task starts, queues, and its batch runs next turn
    assert (commits.batches, commits.steps) == (1, 1)


def test_steps_that_keep_arriving_join_one_batch_up_to_max_turns():
    """Two requests queue a step on each of several consecutive turns (a busy loop): the batch
    waits while turns add steps, MAX_TURNS turns at most, then runs; later steps go to the next."""
    from kvgate.middleware.cache.group_commit import MAX_TURNS

    for turns in (1, 2, MAX_TURNS + 1, MAX_TURNS + 3):
        sizes: list[int] = []

        @contextlib.contextmanager
        def batch():
            sizes.append(0)
            yield Batch()

        commits = GroupCommit(batch)

        def step() -> None:
            sizes[-1] += 1

        async def main(n: int = turns) -> None:
            loop = asyncio.get_running_loop()
            futures: list[asyncio.Future[None]] = []

            def queue(k: int) -> None:  # two requests' steps, whose tasks run next turn
                futures.extend(asyncio.ensure_future(commits.run(step)) for _ in range(2))
                if k + 1 < n:
                    loop.call_soon(queue, k + 1)

            loop.call_soon(queue, 0)
            while len(futures) < 2 * n:
                await asyncio.sleep(0)
            await asyncio.gather(*futures)

        asyncio.run(main())
        assert sum(sizes) == 2 * turns and (commits.batches, commits.steps) == (len(sizes), 2 * turns)
        assert sizes[0] == 2 * min(turns, MAX_TURNS + 1), (turns, sizes)


@pytest.mark.parametrize("lose", [False, True])
def test_each_step_learns_its_batchs_fate_before_its_request_resumes(lose):
    batches = Batches(lose)
    commits = GroupCommit(batches)
    settled: list[tuple[int, bool, list[str]]] = []

    def step(i: int):
        return lambda lost: settled.append((i, lost, list(batches.events)))

    async def main() -> None:
        await asyncio.gather(*(commits.run(step, i) for i in range(3)))
        assert len(settled) == 3  # all settled by the time the requests go on

    asyncio.run(main())
    assert settled == [(i, lose, ["begin", "commit"]) for i in range(3)]  # after the commit, in order


def test_a_failing_step_fails_only_its_own_request():
    commits = GroupCommit(Batches())
    ran: list[int] = []

    def step(i: int) -> None:
        if i == 1:
            raise ValueError("step 1 broke")
        ran.append(i)

    async def main() -> list[object]:
        return await asyncio.gather(*(commits.run(step, i) for i in range(3)), return_exceptions=True)

    outcomes = asyncio.run(main())
    assert outcomes[0] is None and outcomes[2] is None and isinstance(outcomes[1], ValueError)
    assert ran == [0, 2]


def test_a_broken_batch_reaches_every_waiting_request():
    @contextlib.contextmanager
    def broken():
        raise RuntimeError("no batch")
        yield Batch()  # pragma: no cover

    commits = GroupCommit(broken)

    async def main() -> list[object]:
        return await asyncio.gather(*(commits.run(lambda: None) for _ in range(2)), return_exceptions=True)

    assert all(isinstance(o, RuntimeError) for o in asyncio.run(main()))


def test_a_cancelled_request_still_has_its_step_run():
    """The client left while its step was queued: the replica's books and the cache still get it."""
    commits = GroupCommit(Batches())
    ran: list[str] = []

    async def main() -> None:
        task = asyncio.create_task(commits.run(ran.append, "left"))
        await asyncio.sleep(0)  # queued
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await commits.run(ran.append, "stayed")

    asyncio.run(main())
    assert ran == ["left", "stayed"]


def test_a_batch_commits_entries_and_records_another_handle_reads(tmp_path):
    """The real stores: steps of one turn write entries and request records in one transaction
    each; once the requests resume, a second process's handles on the same directories read them."""
    index = SemanticIndex(tmp_path / "responses", DIM)
    requests = DiskRequestLog(tmp_path / "requests", ttl=60, max_bytes=10**7)

    @contextlib.contextmanager
    def batch():
        with index.batch() as done, requests.batch():
            yield done

    commits = GroupCommit(batch)
    ids: dict[str, int] = {}

    def step(i: int) -> None:  # what a record step writes: the answer, then the request's record
        entry = index.add("scope", {"answer": i}, exact_key=f"k{i}")
        assert entry is not None
        rid = new_request_id()
        ids[rid] = entry.id
        requests.record(rid, RequestRecord("t", "r", "miss", "scope", entry.id))

    async def main() -> None:
        await asyncio.gather(*(commits.run(step, i) for i in range(6)))

    asyncio.run(main())
    assert commits.batches == 1
    other_entries = DiskEntryStore(tmp_path / "responses", DIM)
    other_requests = DiskRequestLog(tmp_path / "requests", ttl=60, max_bytes=10**7)
    try:
        for i in range(6):
            found = other_entries.get_exact(f"k{i}")
            assert found is not None and found.response == {"answer": i}
        for rid, entry_id in ids.items():
            record = other_requests.get(rid)
            assert record is not None and record.entry_id == entry_id
    finally:
        other_entries.close()
        other_requests.close()
        index.close()
        requests.close()


def test_a_failed_commit_is_counted_and_never_raised(caplog):
    soft = SoftFailures(logging.getLogger("test"), "store")

    class Failing:
        def __init__(self, on: str) -> None:
            self.on = on

        def __enter__(self) -> None:
            if self.on == "begin":
                raise sqlite3.OperationalError("database is locked")

        def __exit__(self, *exc: object) -> None:
            if self.on == "commit":
                raise sqlite3.OperationalError("disk I/O error")

    failures = (sqlite3.Error,)
    ran = []
    for on in ("begin", "commit"):
        with soft_transaction(lambda: Failing(on), soft, "store", failures):
            ran.append(on)  # the body runs either way
    assert ran == ["begin", "commit"] and soft.counts == {"store": 2}
    # the body's own exception goes on (after the transaction is rolled back)
    with pytest.raises(KeyError):
        with soft_transaction(lambda: Failing("none"), soft, "store", failures):
            raise KeyError("the body's")


def test_a_write_that_failed_inside_a_transaction_is_no_recovery(caplog):
    """A full disk: a write fails inside the transaction and the (empty) commit works; the
    operation still fails, so no "works again" is logged, until a transaction with no failure."""
    soft = SoftFailures(logging.getLogger("test"), "store")
    failures = (sqlite3.Error,)
    caplog.set_level(logging.INFO, logger="test")
    with soft_transaction(contextlib.nullcontext, soft, "store", failures):
        soft.failed("store", OSError(28, "No space left on device"))
    with soft_transaction(contextlib.nullcontext, soft, "store", failures):
        soft.failed("store", OSError(28, "No space left on device"))
    assert soft.counts == {"store": 2} and "works again" not in caplog.text
    assert caplog.text.count("further failures are counted") == 1
    with soft_transaction(contextlib.nullcontext, soft, "store", failures):
        soft.succeeded("store")  # held until the commit
    assert "works again after 2 failures" in caplog.text


def test_request_log_batches_nest_with_its_own_writes(tmp_path):
    log = DiskRequestLog(tmp_path, ttl=60, max_bytes=10**7)
    try:
        rids = [new_request_id() for _ in range(3)]
        with log.batch():
            for rid in rids:
                log.record(rid, RequestRecord("t", "r", "miss", "s", None))
            assert log.get(rids[0]) is not None  # this handle reads its own batch
        assert all(log.get(rid) is not None for rid in rids)
    finally:
        log.close()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_id_blocks_hand_out_each_reserved_id_once_and_grow_while_used_up():
    counter = [0]
    reserved: list[list[int]] = []

    def reserve(n: int) -> list[int]:
        counter[0] += n
        return list(range(counter[0] - n + 1, counter[0] + 1))

    clock = Clock()
    blocks = IdBlocks(reserve, reserved.append, max_block=8, ttl_s=2.0, clock=clock)
    taken = [blocks.take() for _ in range(40)]
    assert len(set(taken)) == 40 and taken == sorted(taken)  # unique, in order within the counter
    assert [len(b) for b in reserved][:5] == [1, 2, 4, 8, 8]  # doubles up to max_block
    assert sorted(i for b in reserved for i in b)[:40] == taken  # every id came from a reservation


def test_id_blocks_never_hand_out_an_id_past_its_blocks_ttl():
    counter = [0]
    calls: list[float] = []
    clock = Clock()

    def reserve(n: int) -> list[int]:
        calls.append(clock.now)
        counter[0] += n
        return list(range(counter[0] - n + 1, counter[0] + 1))

    blocks = IdBlocks(reserve, max_block=8, ttl_s=2.0, clock=clock)
    assert [blocks.take() for _ in range(6)] == [1, 2, 3, 4, 5, 6]  # blocks of 1, 2, 4: id 7 is left
    assert blocks.size == 4
    clock.now += 2.5  # the block's last id is too old now: skipped, and the next block is smaller
    fresh = blocks.take()
    assert fresh == 8 and len(calls) == 4 and blocks.size == 2
    assert blocks.take() == 9  # the rest of the new block, then another one, of 4 again
    assert blocks.take() == 10 and blocks.size == 4


def test_index_ids_from_blocks_are_known_to_its_own_follower(tmp_path):
    """Ids reserved but not yet used are this process's own: its follower never loads them as
    another process's, and another process retries them until they are stored."""
    a = SemanticIndex(tmp_path, DIM, follow_interval_s=0.0)
    b = SemanticIndex(tmp_path, DIM, follow_interval_s=0.0)
    try:
        vec = np.ones(DIM, dtype=np.float32) / np.sqrt(DIM)
        for i in range(20):
            a.add("s", {"i": i}, text=f"q{i}", vector=vec)
            a.catch_up(force=True)
        assert len(a) == 20
        b.catch_up(force=True)
        assert len(b) == 20  # every stored entry reached the other process
    finally:
        a.close()
        b.close()
