"""RoutingState: the local one, and the workers' one (shared memory + ZMQ ipc), two hubs for two workers."""

from __future__ import annotations

import time

import pytest

from kvgate.middleware.config import ReplicaConfig, RoutingConfig
from kvgate.middleware.routing.router import Router
from kvgate.middleware.routing.state_local import LocalState
from kvgate.middleware.routing.state_workers import WorkerHub, WorkersLayout

REPLICAS = [ReplicaConfig(name=f"r{i}", api_base=f"http://127.0.0.1:{9000 + i}/v1") for i in range(2)]


@pytest.fixture()
def hubs():
    layout = WorkersLayout.create([("chat", ["r0", "r1"])], workers=2)
    made = [WorkerHub(layout, w) for w in range(2)]
    yield made
    for hub in made:
        hub.close()
    layout.remove()


def _router(hub: WorkerHub) -> Router:
    cfg = RoutingConfig(policy="cache_aware", prefix={"tokenizer": "text", "block_size": 4})
    return Router(REPLICAS, cfg, state=hub.state("chat", ["r0", "r1"]))


def test_local_state_sums_this_process_only() -> None:
    state = LocalState(["a", "b"])
    state.add_load("a", 2, 100)
    state.add_load("a", -1, -40)
    assert state.load("a") == (1, 60) and state.load("b") == (0, 0)


def test_load_seen_by_one_worker_includes_the_others(hubs) -> None:
    one, two = _router(hubs[0]), _router(hubs[1])
    msgs = [{"role": "user", "content": "x" * 64}]
    plan = one.plan(msgs)
    ticket = one.started(one.replicas[0], plan)
    assert two.stats()["r0"]["in_flight"] == 1
    assert two.stats()["r0"]["pending_prefill_tokens"] == plan.prompt_tokens
    # the other worker's choice avoids the loaded replica although it sent nothing itself
    assert two.choose(two.plan([{"role": "user", "content": "y" * 64}])).name == "r1"
    one.first_token(ticket)
    assert two.stats()["r0"]["pending_prefill_tokens"] == 0
    one.finished(ticket, ok=True)
    assert two.stats()["r0"]["in_flight"] == 0


def test_a_decision_in_one_worker_teaches_the_other(hubs) -> None:
    one, two = _router(hubs[0]), _router(hubs[1])
    time.sleep(0.3)  # the subscribers connect (a PUB drops for peers not yet connected)
    msgs = [{"role": "user", "content": "a shared system prompt " * 8}]
    plan = one.plan(msgs)
    one.finished(one.started(one.replicas[1], plan), ok=True)
    deadline = time.time() + 5
    while hubs[1].received == 0 and time.time() < deadline:
        time.sleep(0.01)
    follow_up = two.plan(msgs)
    assert follow_up.matched_blocks["r1"] == len(plan.hashes) > 0 and follow_up.matched_blocks["r0"] == 0
    assert two.choose(follow_up).name == "r1"


def test_a_worker_outside_the_layout_is_refused() -> None:
    layout = WorkersLayout.create([("chat", ["r0"])], workers=1)
    try:
        with pytest.raises(ValueError, match="worker 1 outside"):
            WorkerHub(layout, 1)
    finally:
        layout.remove()


def test_replicas_added_at_run_time_are_shared_and_counted_by_every_worker(hubs) -> None:
    """What the admin API writes under --workers (fleet_workers.py): one worker's change is every
    worker's list, the added replica gets a spare load column, and both workers count its load."""
    nudged = []
    hubs[1].on_fleet = lambda: nudged.append(1)
    time.sleep(0.3)  # the subscribers connect
    one, two = _router(hubs[0]), _router(hubs[1])
    r2 = ReplicaConfig(name="r2", api_base="http://127.0.0.1:9002/v1")
    hubs[0].fleet.add("chat", r2, REPLICAS)
    hubs[0].nudge_fleet()
    for fleet in (hubs[0].fleet, hubs[1].fleet):
        assert [r.name for r in fleet.replicas("chat", REPLICAS)] == ["r0", "r1", "r2"]
    deadline = time.time() + 5
    while not nudged and time.time() < deadline:
        time.sleep(0.01)
    assert nudged  # the other worker was told
    one.add_replica(r2)
    two.add_replica(r2)
    ticket = one.started(
        next(r for r in one.replicas if r.name == "r2"), one.plan([{"role": "user", "content": "z" * 64}])
    )
    assert two.stats()["r2"]["in_flight"] == 1  # one column, seen by both
    one.finished(ticket, ok=True)
    with pytest.raises(ValueError, match="on route 'chat' already"):
        hubs[1].fleet.add("chat", r2, REPLICAS)
    hubs[1].fleet.remove("chat", "r0", REPLICAS)
    assert [r.name for r in hubs[0].fleet.replicas("chat", REPLICAS)] == ["r1", "r2"]
    hubs[0].fleet.add("chat", REPLICAS[0], REPLICAS)  # a configured replica comes back in its own column
    assert hubs[0].fleet.slot("chat", "r0") == 0
    with pytest.raises(KeyError):
        hubs[0].fleet.remove("chat", "nope", REPLICAS)
    one.close(), two.close()


def test_spare_columns_run_out_and_the_last_replica_stays() -> None:
    from kvgate.middleware.routing.fleet_workers import SPARE_SLOTS, FleetConflict

    layout = WorkersLayout.create([("chat", ["r0"])], workers=1)
    hub = WorkerHub(layout, 0)
    try:
        configured = [REPLICAS[0]]
        slots = set()
        for i in range(SPARE_SLOTS):
            hub.fleet.add("chat", ReplicaConfig(name=f"x{i}", api_base="http://x/v1"), configured)
            slots.add(hub.fleet.slot("chat", f"x{i}"))
        assert len(slots) == SPARE_SLOTS and 0 not in slots  # every added name its own spare column
        with pytest.raises(FleetConflict, match="YAML and restart"):
            hub.fleet.add("chat", ReplicaConfig(name="more", api_base="http://x/v1"), configured)
        hub.fleet.remove("chat", "x0", configured)  # a removed name keeps its column ...
        hub.fleet.add("chat", ReplicaConfig(name="x0", api_base="http://x/v1"), configured)  # ... and gets it back
        for i in range(SPARE_SLOTS):
            hub.fleet.remove("chat", f"x{i}", configured)
        with pytest.raises(FleetConflict, match="last replica"):
            hub.fleet.remove("chat", "r0", configured)
        state = hub.state("chat", ["r0"])
        with pytest.raises(ValueError, match="no load column"):
            state.add_replica("never-added")
    finally:
        hub.close()
        layout.remove()


def test_a_resident_policy_reads_what_each_replica_holds() -> None:
    cfg = RoutingConfig(
        policy={"name": "cache_aware", "new_sessions": "resident"}, prefix={"tokenizer": "text", "block_size": 4}
    )
    router = Router(REPLICAS, cfg)
    system = {"role": "system", "content": "You answer questions about caching, briefly."}

    def talk(opening: str) -> list[dict[str, str]]:
        return [system, {"role": "user", "content": opening * 8}]

    held = 0
    for messages in (talk("alpha says hello "), talk("bravo asks a question ")):
        plan = router.plan(messages)
        router.finished(router.started(router.replicas[0], plan), ok=True)
        router.settle(5)
        held += len(plan.hashes) - plan.matched_blocks.get("r0", 0)
    third = router.plan(talk("charlie starts anew "))
    # r0 holds the system prompt, which two conversations continued differently: a start
    assert third.shared_prefix and third.matched_blocks["r0"] > 0 and third.matched_blocks["r1"] == 0
    assert router.choose(third).name == "r1"  # r0 holds two conversations, r1 none
    follow_up = router.plan(talk("alpha says hello ") + [{"role": "assistant", "content": "hi"}])
    assert not follow_up.shared_prefix and router.choose(follow_up).name == "r0"  # its own history
    assert router.replicas[0].resident_tokens == held * 4 > 0
    assert router.replicas[1].resident_tokens == 0
    plain = Router(REPLICAS, RoutingConfig(policy="cache_aware", prefix={"tokenizer": "text", "block_size": 4}))
    plain.choose(plain.plan(talk("alpha says hello ")))
    assert all(r.resident_tokens == 0 for r in plain.replicas)  # read only by a policy that asks
