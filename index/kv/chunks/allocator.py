"""Keep freed KV buffers in the process instead of handing them back to the OS (glibc only).

A chunk read from the disk tier is a fresh buffer of megabytes (plus its copy when promoted to
RAM). glibc serves blocks that large with mmap and returns them on free, so every load faults its
memory back in page by page (tens of thousands of minor faults for a few chunks), which makes a
load markedly slower than one into reused memory, the two alternating with the allocator's trimming.
Raising the mmap threshold (to glibc's maximum, 32 MiB) and the trim threshold makes freed
buffers come back from the heap with no faults. The cost: memory the process freed stays in its
RSS for reuse (a replica fills its RAM tier to budget anyway).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's upper bound for M_MMAP_THRESHOLD on 64-bit
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Apply the thresholds to this process; False where there is no glibc `mallopt`."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
