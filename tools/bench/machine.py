"""Where a benchmark's figures were taken: CPU, platform, load, filesystem (reported beside every result)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

GB = 1e9


def machine_info() -> dict[str, Any]:
    """Where the figures were taken, and how busy the machine was (latencies depend on it)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        load = None
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "load_average_1_5_15m": load,
    }


def filesystem_of(path: Path) -> dict[str, str] | None:
    """Device and type of the mount holding `path` (from /proc/mounts)."""
    try:
        mounts = [line.split()[:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return None
    real = str(path.resolve())
    best = max(
        (m for m in mounts if len(m) == 3 and (real == m[1] or real.startswith(m[1].rstrip("/") + "/"))),
        key=lambda m: len(m[1]),
        default=None,
    )
    return {"device": best[0], "mount": best[1], "type": best[2]} if best else None


def hardware_info(path: Path | None = None) -> dict[str, Any]:
    """CPUs, CPU model, memory and (with `path`) the filesystem holding it: for benchmarks whose
    figures depend on the disk (`kvgate bench kv`, `kvgate bench e2e`)."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        info["cpu_model"] = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    try:
        info["mem_total_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB, 1)
    except (ValueError, OSError):
        pass
    if path is not None:
        info["filesystem"] = filesystem_of(path)
    return info
