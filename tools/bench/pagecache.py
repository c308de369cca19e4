"""Dropping files from the OS page cache before a timed read, as far as this process may, and
asking how much of them is still resident (`kvgate bench kv`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path
from typing import Any, Sequence


def files_under(directory: Path) -> list[Path]:
    """Every file below `directory`."""
    return [Path(root) / f for root, _, names in os.walk(directory) for f in names]


def resident_bytes(paths: Sequence[Path]) -> int | None:
    """Bytes of `paths` in the page cache (mincore), or None where that cannot be asked."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name or not hasattr(mmap, "PROT_READ"):
        return None
    libc = ctypes.CDLL(libc_name, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for path in paths:
        try:
            size = path.stat().st_size
            if size == 0:
                continue
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            rc = libc.mincore(addr, size, vec)
            libc.munmap(addr, size)
            if rc != 0:
                return None
            total += sum(b & 1 for b in vec) * page
        finally:
            os.close(fd)
    return total


class PageCache:
    """Drops the page cache of given files: `sync`, then posix_fadvise(DONTNEED) per file (modes
    auto, fadvise), then writing 1 to /proc/sys/vm/drop_caches where allowed (auto, global; tried
    until refused once). Records which methods ran and what stayed resident."""

    def __init__(self, mode: str) -> None:
        self.mode = mode  # auto | fadvise | global | none
        self.methods: set[str] = set()
        self.resident_after: list[int] = []
        self.global_failed = False

    def drop(self, paths: Sequence[Path]) -> None:
        if self.mode == "none":
            return
        os.sync()
        if self.mode in ("auto", "fadvise") and hasattr(os, "posix_fadvise"):
            for path in paths:
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    self.methods.add("posix_fadvise")
                except OSError:
                    pass
                finally:
                    os.close(fd)
        data = [p for p in paths if not p.name.startswith("cache.db")]  # SQLite maps its db: not droppable
        left = resident_bytes(data)
        if self.mode in ("auto", "global") and not self.global_failed:
            try:
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("1\n")
                self.methods.add("drop_caches")
                left = resident_bytes(data)
            except OSError:
                self.global_failed = True
        if left is not None:
            self.resident_after.append(left)

    def report(self) -> dict[str, Any]:
        """The JSON's page_cache object."""
        return {
            "mode": self.mode,
            "applied": bool(self.methods),
            "methods": sorted(self.methods),
            "drop_caches_refused": self.global_failed,
            "max_resident_bytes_after_drop": max(self.resident_after) if self.resident_after else None,
        }
