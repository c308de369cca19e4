"""The server process's collector settings (kvgate.middleware.server.heap), in a fresh interpreter: this one's
collector is pytest's."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import gc, weakref
from kvgate.middleware.server.heap import YOUNG_THRESHOLD, settle_heap
before = gc.get_threshold()
settle_heap()
assert gc.get_freeze_count() > 1000, gc.get_freeze_count()
assert gc.get_threshold() == (YOUNG_THRESHOLD, before[1], before[2]), gc.get_threshold()

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made after settling: still found and freed
gone = weakref.ref(a)
del a, b
gc.collect()
assert gone() is None
print("ok")
"""


def test_settle_heap_freezes_start_up_objects_and_still_collects_new_cycles():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
