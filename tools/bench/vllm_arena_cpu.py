"""CPU accounting and per-request records of `kvgate bench vllm` (tools/bench/vllm_arena.py).

On a 2-core machine the router's CPU is taken from the engines' prefill, so each run reports the
CPU the router and the engines spent over its measured requests, read from /proc: every router
arm (kvgate included) is its own subprocess, each vLLM server a subprocess that forks its engine
core. A process tree's CPU is utime + stime + cutime + cstime of every live process in it (the
root and its descendants, found by their parent ids): a child that exits and is reaped inside the
window moves its time into its parent's c-fields, so it is counted once either way. Time of a
descendant reaped by someone outside the tree (an orphan adopted by init) is lost; none of these
routers or servers leaves one behind while it serves. Beside its CPU, each run reports how long the
router's threads were ready to run but waited for a core (`router_core_wait_ms_per_request`, the
scheduler's own count) and how often one lost its core against its will
(`router_involuntary_switches_per_request`), and the first of the two for the router process's
main thread alone (`router_main_core_wait_ms_per_request`: kvgate's event loop; an anchor's main
thread may do none of its serving): on cores the engines keep busy, a router's work is delayed by
that wait as well as by its own length.

Per request (`request_records`): conversation and turn, TTFT, the replica a kvgate router named
(x-kvgate-replica; None through the anchors, which name none), the uncached prompt tokens sent
(the engine's usage: prompt tokens minus cached tokens), the requests the bench client itself had
in flight when it sent this one (`inflight`: all replicas; `queue`: those to the same replica, only
where the replica is known: the client's view, not the engine's scheduler queue), and where kvgate
told its guess (x-kvgate-expected-cached-tokens) the uncached tokens it expected
(`expected_uncached`, beside the engine's `uncached`). Through kvgate,
also `head_s` (the client's wait for the response head, which kvgate sends once the engine's first
event is in) and `proxy_ms` (its Server-Timing steps: read, the plan's parts, engine, relay), so `head_s` less
their sum is the time outside the proxy's handler: the server's parsing, the loop's wait before
the handler ran, and the loopback on either side.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from kvgate.tools.bench.vllm_arena_client import Turn

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, CPU ticks: utime + stime + cutime + cstime) of `pid`, None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    # from the state on: [1] is ppid, [11:15] utime stime cutime cstime (proc(5) fields 4 and 14-17)
    return int(fields[1]), sum(int(f) for f in fields[11:15])


def tree_pids(roots: Iterable[int]) -> list[int]:
    """`roots` and every live descendant of theirs."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                parent[int(entry.name)] = st[0]
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [r for r in roots if r in parent]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def tree_cpu_s(roots: Iterable[int]) -> float:
    """CPU seconds (user + system) the process trees under `roots` have spent so far."""
    ticks = 0
    for pid in tree_pids(roots):
        st = _stat(pid)
        ticks += st[1] if st is not None else 0
    return ticks / CLOCK_TICKS


@dataclass
class CpuWindow:
    """CPU seconds of named process trees between `start()` and `stop()`, and of this process (the
    bench client: its load generator shares the same cores); also how long each tree's threads
    were ready to run but waited for a core, and how often one was taken off a core it still
    wanted (`waited`: {group: (seconds, involuntary switches)}; threads that end inside the
    window take theirs with them)."""

    groups: dict[str, list[int]]
    before: dict[str, float] = field(default_factory=dict)
    spent: dict[str, float] = field(default_factory=dict)
    sched_before: dict[str, tuple[float, int]] = field(default_factory=dict)
    waited: dict[str, tuple[float, int]] = field(default_factory=dict)
    main_before: dict[str, float] = field(default_factory=dict)
    main_waited: dict[str, float] = field(default_factory=dict)  # the roots' main threads only

    def start(self) -> "CpuWindow":
        self.main_before = {name: main_thread_wait_s(pids) for name, pids in self.groups.items()}
        self.sched_before = {name: tree_sched(pids) for name, pids in self.groups.items()}
        self.before = {name: tree_cpu_s(pids) for name, pids in self.groups.items()}
        self.before["client"] = time.process_time()
        return self

    def stop(self) -> dict[str, float]:
        self.spent = {name: tree_cpu_s(pids) - self.before[name] for name, pids in self.groups.items()}
        self.spent["client"] = time.process_time() - self.before["client"]
        for name, pids in self.groups.items():
            wait, switches = tree_sched(pids)
            self.waited[name] = (wait - self.sched_before[name][0], switches - self.sched_before[name][1])
            self.main_waited[name] = main_thread_wait_s(pids) - self.main_before[name]
        return self.spent


def tree_task_files(roots: Iterable[int], *names: str) -> Iterator[tuple[str, ...]]:
    """The texts of /proc/<pid>/task/<tid>/<name>, one per name, of every thread of the trees
    under `roots`, from one walk of the trees (threads that end meanwhile are skipped)."""
    for pid in tree_pids(roots):
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                yield tuple((task / name).read_text() for name in names)
            except OSError:
                continue


def tree_on_cpu_s(roots: Iterable[int]) -> float:
    """Seconds on a CPU of every thread of the trees under `roots`, to the nanosecond (the
    scheduler's own count, schedstat's first field): an idle window of a few seconds is resolved
    where whole clock ticks (10 ms) are not."""
    return sum(int(text.split()[0]) for (text,) in tree_task_files(roots, "schedstat") if text.strip()) / 1e9


def _runnable_wait_ns(schedstat: str) -> int:
    """schedstat's second field: nanoseconds a thread was runnable but waited for a core."""
    parts = schedstat.split()
    return int(parts[1]) if len(parts) > 1 else 0


def status_count(status: str, key: str) -> int:
    """One count of a thread's /proc status text (e.g. "nonvoluntary_ctxt_switches"; 0 if absent)."""
    prefix = key + ":"
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith(prefix)), 0)


def tree_sched(roots: Iterable[int]) -> tuple[float, int]:
    """(seconds the threads of the trees under `roots` have been runnable but waiting for a core,
    their involuntary context switches) so far."""
    wait = switches = 0
    for schedstat, status in tree_task_files(roots, "schedstat", "status"):
        wait += _runnable_wait_ns(schedstat)
        switches += status_count(status, "nonvoluntary_ctxt_switches")
    return wait / 1e9, switches


def main_thread_wait_s(pids: Iterable[int]) -> float:
    """Seconds the main threads of `pids` (not their other threads or children) have waited for a
    core while runnable: for kvgate's proxy, its event loop."""
    wait = 0
    for pid in pids:
        try:
            wait += _runnable_wait_ns(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text())
        except OSError:
            continue
    return wait / 1e9


def idle_cpu_ms_per_s(roots: Sequence[int], seconds: float) -> float | None:
    """CPU ms per second the trees under `roots` spend over `seconds` with nothing sent to them
    (None: no router process, or no window asked for)."""
    if not roots or seconds <= 0:
        return None
    before, t0 = tree_on_cpu_s(roots), time.perf_counter()
    time.sleep(seconds)
    return round((tree_on_cpu_s(roots) - before) * 1000 / (time.perf_counter() - t0), 3)


def cpu_fields(
    spent: dict[str, float],
    requests: int,
    wall_s: float | None = None,
    idle_ms_per_s: float | None = None,
    waited: dict[str, tuple[float, int]] | None = None,
    main_waited: dict[str, float] | None = None,
) -> dict[str, Any]:
    """One run's CPU figures from CpuWindow.stop() of the groups "router" and "engines"; with the
    router's idle rate (`idle_ms_per_s`, measured before the run), also its CPU per request
    beyond what it spends idle over the run's wall time (`router_busy_cpu_ms_per_request`); with
    CpuWindow.waited, the router's wait for a core and its involuntary switches per request."""
    out = {
        "router_cpu_s": round(spent["router"], 3),
        "router_cpu_ms_per_request": round(spent["router"] * 1000 / requests, 3) if requests else None,
        "engines_cpu_s": round(spent["engines"], 3),
        "client_cpu_s": round(spent["client"], 3),
    }
    if idle_ms_per_s is not None and wall_s is not None and requests:
        out["router_idle_cpu_ms_per_s"] = idle_ms_per_s
        out["router_busy_cpu_ms_per_request"] = round((spent["router"] * 1000 - idle_ms_per_s * wall_s) / requests, 3)
    if waited and "router" in waited and requests:
        wait_s, switches = waited["router"]
        out["router_core_wait_ms_per_request"] = round(wait_s * 1000 / requests, 3)
        out["router_involuntary_switches_per_request"] = round(switches / requests, 2)
    if main_waited and "router" in main_waited and requests:
        out["router_main_core_wait_ms_per_request"] = round(main_waited["router"] * 1000 / requests, 3)
    return out


def request_records(turns: Sequence[Turn]) -> list[dict[str, Any]]:
    """One small dict per sent turn, in sending order (see the module docstring)."""
    out = []
    for t in turns:
        busy = [u for u in turns if u is not t and u.sent <= t.sent < u.done]
        rec: dict[str, Any] = {
            "c": t.conversation,
            "t": t.turn,
            "ttft_s": None if t.ttft is None else round(t.ttft, 4),
            "inflight": len(busy),
        }
        if t.prompt_tokens is not None:
            rec["uncached"] = t.prompt_tokens - (t.cached_tokens or 0)
            if t.expected_cached is not None:  # the router's guess of the same, where it told it
                rec["expected_uncached"] = t.prompt_tokens - t.expected_cached
        if t.replica is not None:
            rec["replica"] = t.replica
            rec["queue"] = sum(u.replica == t.replica for u in busy)
        if t.timing is not None:
            rec["head_s"] = round(t.head - t.sent, 4)
            rec["proxy_ms"] = timing_steps(t.timing)
        if t.error is not None:
            rec["error"] = True
        out.append(rec)
    return out


def timing_steps(header: str) -> dict[str, float]:
    """A Server-Timing value's steps, {name: ms} (entries without a duration are left out)."""
    out = {}
    for part in header.split(","):
        name, _, rest = part.strip().partition(";")
        for param in rest.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur":
                try:
                    out[name] = float(value)
                except ValueError:
                    pass
    return out


STEPS = ("read", "plan", "engine", "relay", "outside", "after")
PLAN_PARTS = ("hop", "cache", "prefix", "route")  # the header's parts of `plan` (middleware/server/timing.py)


def plan_ms(steps: dict[str, float]) -> float:
    """A relayed miss's `plan`: the header's own where it gives one as a whole, else the sum of its parts."""
    return steps["plan"] if "plan" in steps else sum(steps.get(part, 0.0) for part in PLAN_PARTS)


def proxy_steps(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Where kvgate's turns spent their time, over every run's request_records that carry its
    steps: per turn kind (a conversation's first turn, its later ones) and step, the mean, median
    and 99th percentile in ms (`plan` with its parts where the header gives them). `outside` is the head's wait less the steps (the server's parsing,
    the loop's wait before the handler, the loopback both ways), `after` the first token's wait
    after the head. {} for an arm whose records carry none (the anchors, the replay)."""
    out: dict[str, Any] = {}
    for kind, later in (("first_turns", False), ("later_turns", True)):
        recs = [
            r
            for rs in runs
            for r in rs.get("request_records", [])
            if "proxy_ms" in r and r.get("ttft_s") is not None and (r["t"] > 0) == later
        ]
        if not recs:
            continue
        values: dict[str, list[float]] = {step: [] for step in STEPS + PLAN_PARTS}
        for r in recs:
            steps = r["proxy_ms"]
            for step in ("read", "engine", "relay"):
                values[step].append(steps.get(step, 0.0))
            values["plan"].append(plan_ms(steps))
            for part in PLAN_PARTS if "plan" not in steps else ():  # a header with `plan` whole has no parts
                values[part].append(steps.get(part, 0.0))
            values["outside"].append(r["head_s"] * 1000 - sum(steps.values()))
            values["after"].append((r["ttft_s"] - r["head_s"]) * 1000)
        out[kind] = {"turns": len(recs)} | {
            step: {
                "mean": round(statistics.fmean(xs), 2),
                "p50": round(statistics.median(xs), 2),
                "p99": round(sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))], 2),
            }
            for step, xs in values.items()
            if xs
        }
    return {"proxy_steps_ms": out} if out else {}


def replica_summary(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Per replica (where the router named it): requests, uncached tokens sent, mean client queue."""
    named = [r for r in records if "replica" in r]
    if not named:
        return None
    out = {}
    for name in sorted({r["replica"] for r in named}):
        mine = [r for r in named if r["replica"] == name]
        out[name] = {
            "requests": len(mine),
            "uncached_tokens": sum(r.get("uncached", 0) for r in mine),
            "queue_mean": round(statistics.fmean(r["queue"] for r in mine), 3),
        }
    return out


def arm_cpu(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """An arm over its runs: router, engines and client CPU seconds as the mean of the runs', router
    ms per request over every run's requests together."""
    measured = [r for r in runs if r.get("router_cpu_s") is not None]
    if not measured:
        return {}
    requests = sum(r["requests"] for r in measured)

    out = {
        "router_cpu_s": _mean_of(measured, "router_cpu_s"),
        "engines_cpu_s": _mean_of(measured, "engines_cpu_s"),
        "client_cpu_s": _mean_of(measured, "client_cpu_s"),
        "router_cpu_ms_per_request": round(sum(r["router_cpu_s"] for r in measured) * 1000 / requests, 3)
        if requests
        else None,
    }
    idle = [r for r in measured if r.get("router_idle_cpu_ms_per_s") is not None]
    if idle:
        out["router_idle_cpu_ms_per_s"] = _mean_of(idle, "router_idle_cpu_ms_per_s")
        out["router_busy_cpu_ms_per_request"] = _mean_of(idle, "router_busy_cpu_ms_per_request")
    waited = [r for r in measured if r.get("router_core_wait_ms_per_request") is not None]
    if waited:
        out["router_core_wait_ms_per_request"] = _mean_of(waited, "router_core_wait_ms_per_request")
        out["router_involuntary_switches_per_request"] = _mean_of(waited, "router_involuntary_switches_per_request")
    main = [r for r in measured if r.get("router_main_core_wait_ms_per_request") is not None]
    if main:
        out["router_main_core_wait_ms_per_request"] = _mean_of(main, "router_main_core_wait_ms_per_request")
    return out


def _mean_of(runs: Sequence[dict[str, Any]], key: str) -> float:
    return round(statistics.fmean(r[key] for r in runs), 3)
