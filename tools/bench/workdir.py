"""What a benchmark leaves of its work directory: the logs, configs and results a reader of the
run needs, not the stores it filled.

A run fills response caches, request logs and KV tiers under its work directory; repeated runs
would pile them up in the system's temp dir (a KV bench leaves gigabytes). So a bench that made
its own work directory calls `tidy` at its end (`tidied`, which also says where the logs are): every file whose name does not end in
one of KEEP_SUFFIXES goes, then every folder left empty. A directory the user named is theirs:
the benches leave it whole.
"""

from __future__ import annotations

import os
from pathlib import Path

KEEP_SUFFIXES = (".log", ".yaml", ".yml", ".json", ".jsonl", ".txt", ".csv")


def tidy(work: Path) -> int:
    """Delete the files under `work` not named *KEEP_SUFFIXES and the folders left empty (never
    `work` itself); the bytes freed. Files another process removes meanwhile are skipped.

    Invariant: every file under `work` whose name ends in KEEP_SUFFIXES is still there after."""
    freed = 0
    for root, dirs, files in os.walk(work, topdown=False):
        here = Path(root)
        for name in files:
            if name.endswith(KEEP_SUFFIXES):
                continue
            path = here / name
            try:
                size = path.lstat().st_size
                path.unlink()
                freed += size
            except FileNotFoundError:
                continue
        for name in dirs:
            try:
                (here / name).rmdir()  # only when empty: a kept file keeps its folders
            except OSError:
                continue
    return freed


def tidied(work: Path) -> str:
    """`tidy(work)`, then the line a bench prints about it."""
    freed = tidy(work)
    return f"logs and configs kept in {work}; the stores it filled removed ({freed / 2**20:.1f} MiB)"
