"""kvgate.index.kv.chunks.allocator: a freed chunk-sized buffer comes back without page faults."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

PROBE = """
import resource, sys
from kvgate.index.kv.chunks.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "on" else False
size = 12 << 20  # one SmolLM2 KV chunk of 256 tokens
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buf = bytearray(size)  # zero-filled: touches every page
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del buf
print(applied, max(faults[1:]))
"""


def probe(mode: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_freed_chunk_buffers_are_reused_without_faults() -> None:
    applied, faults_on = probe("on")
    assert applied
    _, faults_off = probe("off")
    pages = (12 << 20) // resource.getpagesize()
    assert faults_off >= pages // 2  # glibc default: each 12 MB buffer is mmapped and faulted in again
    assert faults_on < pages // 20  # with the thresholds raised: reused from the heap
