"""`kvgate serve --workers 2` over two demo replicas: requests spread over the workers, a routing
decision made in one worker steers a follow-up that reaches the other, the in-flight counts each
worker reports include the other's, an answer stored by one worker is a hit in the other, and a
replica added or removed through the admin API of one worker is added or removed in every worker."""

from __future__ import annotations

import concurrent.futures
import os
import random
import re
import signal
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import yaml

from kvgate.engines.demo import create_fake_app
from kvgate.tools.bench.procs import Proc, ServerThread, free_port, kvgate_argv

WORKERS = 2
ADMIN = {"authorization": "Bearer admin-key"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Proc]]:
    tmp = tmp_path_factory.mktemp("workers")
    replicas = [ServerThread(create_fake_app(), port=free_port()).start() for _ in range(2)]
    port = free_port()
    config = {
        "cache_dir": str(tmp / "cache"),
        "auth": {"admin_keys": ["admin-key"]},
        "routes": [
            {
                "name": "local",
                "model": "smol*",
                "backend": {"model": "openai/smollm2", "api_key": "none", "timeout": 20},
                "semantic": {"enabled": False},
                "replicas": [{"name": f"r{i}", "api_base": f"{r.url}/v1"} for i, r in enumerate(replicas)],
                "routing": {
                    "policy": "cache_aware",
                    "block_size": 64,
                    "tokenizer": "text",
                },  # block 0: past the template
            }
        ],
    }
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    proc = Proc(
        "proxy",
        kvgate_argv(
            "serve",
            "--config",
            str(tmp / "config.yaml"),
            "--port",
            str(port),
            "--workers",
            str(WORKERS),
            "--log-level",
            "warning",
        ),
        tmp,
    )
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health")
        _wait_for_every_worker(f"http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.stop()
        for r in replicas:
            r.stop()
    shared = re.search(r"routing state shared in (\S+)", proc.log_path.read_text())
    assert shared is not None and not Path(shared.group(1)).exists()  # the supervisor removed it


def _wait_for_every_worker(url: str, timeout_s: float = 60.0) -> None:
    """The first /health answer means one worker is up; on a loaded machine the other may still be
    starting, and the kernel gives every connection to the ones accepting. Fresh connections until
    each worker has answered once."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while len(seen) < WORKERS:
        assert time.monotonic() < deadline, f"only workers {sorted(seen)} answered within {timeout_s:.0f} s"
        seen.add(str(httpx.get(f"{url}/health", timeout=10).json()["worker"]))
        time.sleep(0.05)


@pytest.fixture()
def proxy(served: tuple[str, Proc]) -> tuple[str, None]:
    return served[0], None


@pytest.fixture()
def proxy_proc(served: tuple[str, Proc]) -> Proc:
    return served[1]


def chat(url: str, content: str, system: str | None = None, **headers: str) -> httpx.Response:
    """One request on a fresh connection (the kernel picks the worker per connection)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    resp = httpx.post(
        f"{url}/v1/chat/completions", json={"model": "smol-1", "messages": messages}, headers=headers, timeout=30
    )
    assert resp.status_code == 200, resp.text
    return resp


def test_requests_spread_over_the_workers(proxy) -> None:
    url, _ = proxy
    workers = [chat(url, f"spread question {i}?").headers["x-kvgate-worker"] for i in range(24)]
    assert set(workers) == {str(w) for w in range(WORKERS)}


def test_a_decision_in_one_worker_steers_a_follow_up_in_the_other(proxy) -> None:
    url, _ = proxy
    crossed, rng = 0, random.Random(5)
    for n in range(8):  # without sharing, each follow-up in the other worker would tie: 1 in 2 right
        # a few unrelated requests first: each lands on either worker and moves its tie-break turn,
        # so the two workers' ties cannot fall the same way by their own lockstep
        for extra in range(rng.randrange(4)):
            chat(url, f"unrelated {n}-{extra}?")
        system = f"conversation {n}: " + " ".join(f"rule{n}-{i}" for i in range(120))
        first = chat(url, "first turn?", system)
        replica, worker = first.headers["x-kvgate-replica"], first.headers["x-kvgate-worker"]
        for turn in range(20):  # fresh connections until one lands on the other worker
            follow = chat(url, f"follow-up {turn}?", system)
            if follow.headers["x-kvgate-worker"] != worker:
                assert follow.headers["x-kvgate-replica"] == replica, (n, turn)
                crossed += 1
                break
    assert crossed >= 6


def _in_flight(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(r"^kvgate_replica_requests_in_flight\{[^}]*\}\s+(\S+)$", text, re.M))


def test_in_flight_counts_include_the_other_workers(proxy) -> None:
    url, _ = proxy
    slow = 8
    # which worker accepts a connection is the kernel's choice: a batch that all landed on one
    # worker proves nothing, so it is sent again (a few times at most)
    for attempt in range(3):
        with concurrent.futures.ThreadPoolExecutor(slow) as pool:
            running = [pool.submit(chat, url, f"slow {attempt} {i} [[sleep=5]]") for i in range(slow)]
            deadline = time.time() + 4
            while _in_flight(url) < slow and time.time() < deadline:  # until all eight were sent on
                time.sleep(0.1)
            seen = [_in_flight(url) for _ in range(5)]  # each scrape on a fresh connection: either worker
            served = {f.result().headers["x-kvgate-worker"] for f in running}
        if len(served) == WORKERS:
            break
    assert len(served) == WORKERS, "every batch of slow requests went to one worker: the check below proves nothing"
    assert seen == [float(slow)] * len(seen)
    assert _in_flight(url) == 0


def test_an_answer_stored_by_one_worker_is_a_hit_in_the_other(proxy) -> None:
    url, _ = proxy
    first = chat(url, "What is stored once?")
    for _ in range(20):
        again = chat(url, "What is stored once?")
        if again.headers["x-kvgate-worker"] != first.headers["x-kvgate-worker"]:
            assert again.headers["x-kvgate-cache"] == "exact"
            content = [r.json()["choices"][0]["message"]["content"] for r in (first, again)]
            assert content[0] == content[1] != ""
            return
    pytest.fail("no repeat reached the other worker in 20 fresh connections")


def test_workers_below_one_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    from kvgate.middleware.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--config", "x.yaml", "--workers", "0"])
    assert exit_.value.code == 2 and "--workers: must be at least 1, got 0" in capsys.readouterr().err


def _workers_of(supervisor: int) -> list[int]:
    """The pids of the supervisor's live children (its workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[1]) == supervisor and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def test_a_killed_worker_is_replaced_and_its_load_forgotten(proxy, proxy_proc) -> None:
    url, _ = proxy
    workers = _workers_of(proxy_proc.proc.pid)
    assert len(workers) == WORKERS
    held = 16  # each on its own connection, which the kernel hashes to a worker: all 16 on one is 1 in 2^15
    with concurrent.futures.ThreadPoolExecutor(held) as pool:
        running = [
            pool.submit(
                httpx.post,
                f"{url}/v1/chat/completions",
                timeout=30,
                json={"model": "smol-1", "messages": [{"role": "user", "content": f"held {i} [[sleep=4]]"}]},
            )
            for i in range(held)
        ]
        deadline = time.time() + 6
        while _in_flight(url) < held and time.time() < deadline:
            time.sleep(0.1)
        os.kill(workers[0], signal.SIGKILL)  # its requests die with it; its row of the load table must not stay
        outcomes = [f.result().status_code if f.exception() is None else repr(f.exception()) for f in running]
    dropped = [o for o in outcomes if o != 200]
    assert dropped and len(dropped) < held, outcomes  # both workers held some
    deadline = time.time() + 30
    while (len(_workers_of(proxy_proc.proc.pid)) < WORKERS or _in_flight(url) != 0) and time.time() < deadline:
        time.sleep(0.2)
    assert workers[0] not in _workers_of(proxy_proc.proc.pid) and len(_workers_of(proxy_proc.proc.pid)) == WORKERS
    assert _in_flight(url) == 0
    served = {chat(url, f"after the restart {i}?").headers["x-kvgate-worker"] for i in range(24)}
    assert served == {str(w) for w in range(WORKERS)}


def _lists(url: str) -> dict[str, list[str]]:
    """Each worker's replica names, per worker, from GET /v1/admin/replicas on fresh connections."""
    seen: dict[str, list[str]] = {}
    for _ in range(40):
        with httpx.Client(base_url=url, timeout=10) as client:  # one connection: one worker answers both
            worker = str(client.get("/health").json()["worker"])
            resp = client.get("/v1/admin/replicas", headers=ADMIN)
        seen.setdefault(worker, sorted(r["name"] for r in resp.json()["routes"]["local"]))
        if len(seen) == WORKERS:
            break
    return seen


def _routed_to(url: str, replica: str, tries: int = 60) -> set[str]:
    """The workers that sent a request to `replica` in `tries` fresh requests."""
    return {
        r.headers["x-kvgate-worker"]
        for i in range(tries)
        if (r := chat(url, f"to whom {replica} {i} {random.random()}?")).headers["x-kvgate-replica"] == replica
    }


def test_a_replica_added_in_one_worker_is_added_in_every_worker(proxy) -> None:
    url, _ = proxy
    extra = ServerThread(create_fake_app(), port=free_port()).start()
    try:
        added = httpx.post(
            f"{url}/v1/admin/replicas",
            headers=ADMIN,
            timeout=30,
            json={"route": "local", "name": "r9", "api_base": f"{extra.url}/v1"},
        )
        assert added.status_code == 201, added.text
        deadline = time.time() + 10  # the other worker follows within about a second
        while set(map(tuple, _lists(url).values())) != {("r0", "r1", "r9")} and time.time() < deadline:
            time.sleep(0.2)
        assert set(map(tuple, _lists(url).values())) == {("r0", "r1", "r9")}
        assert _routed_to(url, "r9") == {str(w) for w in range(WORKERS)}  # both workers route to it
        again = httpx.post(
            f"{url}/v1/admin/replicas",
            headers=ADMIN,
            timeout=30,
            json={"route": "local", "name": "r9", "api_base": f"{extra.url}/v1"},
        )
        assert again.status_code == 409  # whichever worker took it: the shared lists have it
        removed = httpx.delete(f"{url}/v1/admin/replicas/local/r9", headers=ADMIN, timeout=30)
        assert removed.status_code == 200, removed.text
        deadline = time.time() + 10
        while set(map(tuple, _lists(url).values())) != {("r0", "r1")} and time.time() < deadline:
            time.sleep(0.2)
        assert set(map(tuple, _lists(url).values())) == {("r0", "r1")}
        assert not _routed_to(url, "r9", tries=20)
    finally:
        extra.stop()
