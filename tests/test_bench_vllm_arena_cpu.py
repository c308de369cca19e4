"""`kvgate bench vllm`'s CPU accounting (tools/bench/vllm_arena_cpu.py) against processes that burn
a known amount of CPU, its per-request records, and the client reading x-kvgate-replica."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from kvgate.middleware.forward.http1 import Connection, Pool
from kvgate.tools.bench.vllm_arena_client import Turn, send_turn
from kvgate.tools.bench.vllm_arena_cpu import (
    CpuWindow,
    arm_cpu,
    cpu_fields,
    idle_cpu_ms_per_s,
    proxy_steps,
    replica_summary,
    request_records,
    timing_steps,
    tree_on_cpu_s,
    tree_pids,
    tree_sched,
)

# Waits for a line on stdin, then burns CPU (by its own CPU clock, so a busy machine makes it slower,
# not cheaper): itself SELF_S, a forked child REAPED_S (exits, is waited for), a forked child LIVE_S
# (stays alive, asleep). Prints "done" and waits for stdin to close.
BURNER = textwrap.dedent("""
    import os, sys, time
    def burn(seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass
    self_s, reaped_s, live_s = (float(a) for a in sys.argv[1:4])
    print("ready", flush=True)
    sys.stdin.readline()
    burn(self_s)
    pid = os.fork()
    if pid == 0:
        burn(reaped_s)
        os._exit(0)
    os.waitpid(pid, 0)
    r, w = os.pipe()
    if os.fork() == 0:
        burn(live_s)
        os.write(w, b"x")
        time.sleep(60)
        os._exit(0)
    os.read(r, 1)
    print("done", flush=True)
    sys.stdin.readline()
""")


def _burner(self_s: float, reaped_s: float, live_s: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", BURNER, str(self_s), str(reaped_s), str(live_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _go(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


def _finish(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None and proc.stdout.readline().strip() == "done"


def _end(proc: subprocess.Popen[str]) -> None:
    import os
    import signal

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def test_cpu_window_counts_the_tree_it_watches_and_nothing_else():
    watched, other = _burner(0.5, 0.3, 0.2), _burner(0.6, 0.0, 0.0)
    try:
        window = CpuWindow({"router": [watched.pid], "engines": [other.pid]}).start()
        _go(watched)
        _finish(watched)
        assert len(tree_pids([watched.pid])) == 2  # the burner and its live child; the reaped one is gone
        spent = window.stop()
        assert 0.95 <= spent["router"] <= 1.3, spent  # 0.5 + 0.3 reaped + 0.2 alive
        assert spent["engines"] < 0.1, spent  # started, not yet told to burn
        window = CpuWindow({"router": [watched.pid], "engines": [other.pid]}).start()
        _go(other)
        _finish(other)
        spent = window.stop()
        assert spent["router"] < 0.1, spent  # its burning was before this window
        assert 0.55 <= spent["engines"] <= 0.8, spent
    finally:
        _end(watched)
        _end(other)


def test_the_window_sees_a_tree_wait_for_a_core_it_shares():
    """Two burners pinned to one core, burning at once: each waits for the core about as long as
    the other burns, and is switched out against its will; the figures per request follow."""
    import os

    a, b = _burner(0.4, 0.0, 0.0), _burner(0.4, 0.0, 0.0)
    try:
        core = min(os.sched_getaffinity(0))
        for p in (a, b):
            os.sched_setaffinity(p.pid, {core})
        window = CpuWindow({"router": [a.pid], "engines": [b.pid]}).start()
        _go(a)
        _go(b)
        _finish(a)
        _finish(b)
        window.stop()
        wait_s, switches = window.waited["router"]
        assert 0.15 <= wait_s <= 5 and switches >= 1, window.waited
        assert tree_sched([a.pid])[0] >= wait_s
        assert 0.15 <= window.main_waited["router"] <= wait_s + 1e-6  # the burner is one thread
        fields = cpu_fields(window.spent, 10, waited=window.waited, main_waited=window.main_waited)
        assert fields["router_core_wait_ms_per_request"] == round(wait_s * 100, 3)
        assert fields["router_involuntary_switches_per_request"] == round(switches / 10, 2)
        assert fields["router_main_core_wait_ms_per_request"] == round(window.main_waited["router"] * 100, 3)
    finally:
        _end(a)
        _end(b)


def test_cpu_fields_and_arm_means():
    run = cpu_fields({"router": 0.5, "engines": 40.0, "client": 1.0}, 100)
    assert run == {"router_cpu_s": 0.5, "router_cpu_ms_per_request": 5.0, "engines_cpu_s": 40.0, "client_cpu_s": 1.0}
    other = {**cpu_fields({"router": 1.5, "engines": 60.0, "client": 2.0}, 100), "requests": 100}
    arm = arm_cpu([{**run, "requests": 100}, other])
    assert arm == {"router_cpu_s": 1.0, "engines_cpu_s": 50.0, "client_cpu_s": 1.5, "router_cpu_ms_per_request": 10.0}
    assert arm_cpu([]) == {}


def test_the_idle_window_reads_a_threads_cpu_to_below_a_tick():
    """A process whose one extra thread burns ~40% of a core: the idle rate sees it, from the
    scheduler's nanosecond counts of every thread."""
    burner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import threading, time\n"
            "def duty():\n"
            "    while True:\n"
            "        end = time.thread_time() + 0.004\n"
            "        while time.thread_time() < end: pass\n"
            "        time.sleep(0.006)\n"
            "threading.Thread(target=duty, daemon=True).start()\n"
            "time.sleep(60)\n",
        ],
        start_new_session=True,
    )
    try:
        assert tree_on_cpu_s([burner.pid]) >= 0.0
        rate = idle_cpu_ms_per_s([burner.pid], 1.0)
        assert rate is not None and 150 <= rate <= 450, rate  # 4 ms of every ~10 (the CPU may be shared)
        assert idle_cpu_ms_per_s([], 1.0) is None and idle_cpu_ms_per_s([burner.pid], 0) is None
    finally:
        burner.kill()
        burner.wait()


def test_busy_cpu_per_request_is_what_is_left_after_the_idle_rate():
    run = cpu_fields({"router": 1.0, "engines": 40.0, "client": 1.0}, 100, wall_s=50.0, idle_ms_per_s=8.0)
    # 1000 ms in all, 8 ms/s x 50 s of it idle: 600 ms over 100 requests
    assert run["router_idle_cpu_ms_per_s"] == 8.0 and run["router_busy_cpu_ms_per_request"] == 6.0
    other = {**cpu_fields({"router": 1.0, "engines": 40.0, "client": 1.0}, 100, 50.0, 4.0), "requests": 100}
    arm = arm_cpu([{**run, "requests": 100}, other])
    assert arm["router_idle_cpu_ms_per_s"] == 6.0 and arm["router_busy_cpu_ms_per_request"] == 7.0
    assert "router_idle_cpu_ms_per_s" not in cpu_fields({"router": 1.0, "engines": 1.0, "client": 1.0}, 10)
    spent = {"router": 1.0, "engines": 1.0, "client": 1.0}
    waits = [cpu_fields(spent, 100, waited={"router": (w, n)}) for w, n in ((0.2, 50), (0.4, 150))]
    arm = arm_cpu([{**w, "requests": 100} for w in waits])
    assert arm["router_core_wait_ms_per_request"] == 3.0 and arm["router_involuntary_switches_per_request"] == 1.0
    assert "router_core_wait_ms_per_request" not in arm_cpu([{**run, "requests": 100}])


def test_request_records_count_the_clients_own_in_flight_requests_per_replica():
    def turn(c: int, sent: float, done: float, replica: str | None, prompt: int, cached: int) -> Turn:
        t = Turn(c, 0, [], "p", sent=sent, done=done, ttft=0.1, prompt_tokens=prompt, cached_tokens=cached)
        t.replica = replica
        return t

    turns = [
        turn(0, 0.0, 5.0, "v0", 100, 64),
        turn(1, 1.0, 3.0, "v1", 50, 0),
        turn(2, 2.0, 4.0, "v0", 80, 16),
        turn(3, 3.5, 6.0, "v1", 10, 0),
    ]
    turns[2].expected_cached = 32  # the router's guess (x-kvgate-expected-cached-tokens), where it told one
    recs = request_records(turns)
    assert [r.get("expected_uncached") for r in recs] == [None, None, 48, None]
    assert [r["inflight"] for r in recs] == [0, 1, 2, 2]
    assert [r["queue"] for r in recs] == [0, 0, 1, 0]  # turn 1 ended at 3.0, before turn 3 was sent
    assert [r["uncached"] for r in recs] == [36, 50, 64, 10]
    assert replica_summary(recs) == {
        "v0": {"requests": 2, "uncached_tokens": 100, "queue_mean": 0.5},
        "v1": {"requests": 2, "uncached_tokens": 60, "queue_mean": 0.0},
    }
    anchor = request_records([turn(0, 0.0, 1.0, None, 10, 0)])
    assert "replica" not in anchor[0] and "queue" not in anchor[0]
    assert "proxy_ms" not in anchor[0] and "head_s" not in anchor[0]
    assert replica_summary(anchor) is None


def test_request_records_keep_kvgates_steps_and_the_heads_wait():
    t = Turn(0, 1, [], "p", sent=10.0, done=12.0, ttft=0.9)
    t.timing, t.head = "read;dur=0.20, plan;dur=1.50, engine;dur=850.00, relay;dur=0.30", 10.8625
    (rec,) = request_records([t])
    assert rec["head_s"] == 0.8625
    assert rec["proxy_ms"] == {"read": 0.2, "plan": 1.5, "engine": 850.0, "relay": 0.3}


def test_timing_steps_reads_what_the_format_allows():
    assert timing_steps('cache;desc="hit";dur=1.5, edge, db;dur=x, total;dur=2') == {"cache": 1.5, "total": 2.0}


def test_a_connection_keeps_only_the_headers_asked_for():
    conn = Connection(frozenset({b"x-kvgate-replica"}))
    conn.data_received(b"HTTP/1.1 200 OK\r\nX-Kvgate-Replica: v1\r\nServer: x\r\ncontent-length: 0\r\n\r\n")
    assert conn.kept == {"x-kvgate-replica": "v1"}
    plain = Connection()  # the relay's: keeps none
    plain.data_received(b"HTTP/1.1 200 OK\r\nX-Kvgate-Replica: v1\r\ncontent-length: 0\r\n\r\n")
    assert plain.kept == {}


@pytest.mark.parametrize("header", [b"x-kvgate-replica: v0\r\nserver-timing: read;dur=0.10, engine;dur=5.00\r\n", b""])
def test_send_turn_records_the_replica_a_router_names(header):
    body = b'data: {"choices":[{"text":"hi","finish_reason":"length"}]}\n\ndata: [DONE]\n\n'

    async def main() -> Turn:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\n" + header + b"content-length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Pool(keepalive_s=3.0, keep_headers=frozenset({"x-kvgate-replica", "server-timing"}))
        turn = Turn(0, 0, [], "User: x\nAssistant:")
        try:
            await send_turn(pool, f"http://127.0.0.1:{port}/v1/completions", turn, "m", 4, 10.0)
        finally:
            await pool.aclose()
            server.close()
        return turn

    turn = asyncio.run(main())
    assert turn.error is None and turn.answer == "hi"
    assert turn.replica == ("v0" if header else None)
    assert turn.timing == ("read;dur=0.10, engine;dur=5.00" if header else None)
    assert turn.sent <= turn.head <= turn.done


def test_proxy_steps_split_kvgates_turns_by_kind_and_step():
    def rec(t: int, ttft: float, head: float, steps: dict[str, float]) -> dict:
        return {"c": 0, "t": t, "ttft_s": ttft, "head_s": head, "proxy_ms": steps}

    steps = {"read": 0.2, "plan": 1.0, "engine": 900.0, "relay": 0.1}
    runs = [
        {"request_records": [rec(0, 1.0, 0.9995, steps), rec(1, 0.5, 0.4, {**steps, "engine": 390.0})]},
        {"request_records": [{"c": 1, "t": 0, "ttft_s": 2.0}, rec(0, 1.0, 0.9013, steps)]},  # an anchor-like record
    ]
    out = proxy_steps(runs)["proxy_steps_ms"]
    assert out["first_turns"]["turns"] == 2 and out["later_turns"]["turns"] == 1
    first = out["first_turns"]
    assert first["engine"] == {"mean": 900.0, "p50": 900.0, "p99": 900.0}
    assert first["outside"]["mean"] == pytest.approx(
        (98.2 + 0.0) / 2, abs=0.01
    )  # heads 999.5 and 901.3 ms, steps 901.3
    later = out["later_turns"]
    assert later["outside"]["p50"] == pytest.approx(400.0 - 391.3, abs=0.01)
    assert later["after"]["p50"] == pytest.approx(100.0)
    assert proxy_steps([{"request_records": [{"c": 0, "t": 0, "ttft_s": 1.0}]}]) == {}


def test_proxy_steps_sum_the_plans_parts_where_the_header_splits_it():
    parts = {"read": 0.2, "hop": 0.3, "cache": 0.4, "prefix": 0.5, "route": 0.6, "engine": 900.0, "relay": 0.1}
    records = [{"c": 0, "t": 0, "ttft_s": 1.0, "head_s": 0.9021, "proxy_ms": parts}]
    first = proxy_steps([{"request_records": records}])["proxy_steps_ms"]["first_turns"]
    assert first["plan"]["mean"] == pytest.approx(1.8)
    assert first["prefix"]["p50"] == pytest.approx(0.5)
    assert first["outside"]["mean"] == pytest.approx(0.0, abs=0.01)
    older = {"read": 0.2, "plan": 1.8, "engine": 900.0, "relay": 0.1}  # no parts: none reported
    first = proxy_steps([{"request_records": [{**records[0], "proxy_ms": older}]}])["proxy_steps_ms"]["first_turns"]
    assert first["plan"]["mean"] == pytest.approx(1.8) and "prefix" not in first
