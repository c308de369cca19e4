"""A short CPU slice for the proxy's threads (Linux's EEVDF scheduler, custom slices: 6.12+).

Where engines keep every core busy (vLLM's CPU build spins on its cores; on a GPU node the
engine's own processes may too), a proxy thread woken by a request or a token waits for the
running task's slice to end before it gets a core, at every wake-up. Asking the kernel for a
short slice (`sched_setattr`'s `sched_runtime` on a SCHED_OTHER or SCHED_BATCH thread) lets
the woken thread run sooner; its share of the CPU (its weight, that is its nice value) does not
change, so the engines lose no share to it. The kernel bounds a slice to 0.1–100 ms. Threads and
processes started afterwards (the worker threads, `--workers`' processes) inherit it, and an
`exec` keeps it.

`kvgate serve` applies `server.cpu_slice_us` to all its threads before the server starts
(middleware/cli.py).

May import: nothing of kvgate's.
"""

from __future__ import annotations

import ctypes
import os
import platform

MIN_US, MAX_US = 100, 100_000  # the kernel's bounds on a custom slice
_FAIR_POLICIES = (0, 3)  # SCHED_OTHER, SCHED_BATCH: the policies a slice applies to
# (sched_setattr, sched_getattr) on the architectures that number them so
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}


class _SchedAttr(ctypes.Structure):
    """The kernel's `struct sched_attr` (its first, 56-byte version)."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("sched_policy", ctypes.c_uint32),
        ("sched_flags", ctypes.c_uint64),
        ("sched_nice", ctypes.c_int32),
        ("sched_priority", ctypes.c_uint32),
        ("sched_runtime", ctypes.c_uint64),
        ("sched_deadline", ctypes.c_uint64),
        ("sched_period", ctypes.c_uint64),
        ("sched_util_min", ctypes.c_uint32),
        ("sched_util_max", ctypes.c_uint32),
    ]


def _calls() -> tuple[ctypes.CDLL, int, int] | str:
    if platform.system() != "Linux":
        return "custom CPU slices are a Linux feature"
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        return f"custom CPU slices are not wired up for {platform.machine()} here (x86_64, aarch64)"
    return ctypes.CDLL(None, use_errno=True), *numbers


def _get(libc: ctypes.CDLL, number: int, tid: int) -> _SchedAttr:
    attr = _SchedAttr()
    if libc.syscall(number, tid, ctypes.byref(attr), ctypes.sizeof(_SchedAttr), 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return attr


def cpu_slice_us(tid: int = 0) -> int | None:
    """The slice of thread `tid` (0: the calling one) in µs as the kernel reports it, custom or
    its default; None where it reports none (before Linux 6.12, or not Linux)."""
    calls = _calls()
    if isinstance(calls, str):
        return None
    libc, _, get = calls
    runtime = _get(libc, get, tid).sched_runtime
    return runtime // 1000 if runtime else None


def set_cpu_slice(us: int, tid: int = 0) -> str | None:
    """Ask for a `us` µs slice for thread `tid` (0: the calling one), its policy and nice kept.
    None when the kernel took it; otherwise why not, for the caller to say (the proxy works
    without it). Invariant: on None, cpu_slice_us(tid) == us."""
    if not MIN_US <= us <= MAX_US:
        raise ValueError(f"a CPU slice is {MIN_US}-{MAX_US} µs, got {us}")
    calls = _calls()
    if isinstance(calls, str):
        return calls
    libc, set_number, get_number = calls
    try:
        attr = _get(libc, get_number, tid)
    except OSError as exc:
        return f"could not read the thread's scheduling: {exc.strerror}"
    if attr.sched_policy not in _FAIR_POLICIES:
        return f"the thread runs under scheduling policy {attr.sched_policy}, not SCHED_OTHER or SCHED_BATCH"
    attr.size, attr.sched_flags, attr.sched_runtime = ctypes.sizeof(_SchedAttr), 0, us * 1000
    if libc.syscall(set_number, tid, ctypes.byref(attr), 0) != 0:
        return f"the kernel refused it: {os.strerror(ctypes.get_errno())}"
    if cpu_slice_us(tid) != us:  # kernels before 6.12 take the call and ignore the field
        return f"this kernel ({platform.release()}) has no custom slices (Linux 6.12 or later has)"
    return None


def set_process_cpu_slice(us: int) -> str | None:
    """set_cpu_slice for every thread this process has now (libraries start some on import);
    the threads started later inherit it from theirs. None when every one took it."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        reason = set_cpu_slice(us, tid)
        if reason is not None and os.path.exists(f"/proc/self/task/{tid}"):  # not a thread that just ended
            return reason
    return None
