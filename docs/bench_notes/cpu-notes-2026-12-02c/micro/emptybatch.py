"""The fixed cost of the group commit's batch, with nothing written in it: both stores' transactions
(`_write_batch`), the index's alone, the log's alone."""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1].parent / "cpu-notes-2026-12-02b"))
from micro_setup import pipeline  # noqa: E402  (the thirtieth session's)
p, route = pipeline()
c = p.cache
def t(cm, n=20000):
    for _ in range(200):
        with cm(): pass
    s = time.process_time()
    for _ in range(n):
        with cm(): pass
    return (time.process_time() - s) / n * 1e6
for _ in range(2):
    print(f"both {t(c._write_batch):.1f}  index {t(c.index.batch):.1f}  log {t(c.requests.batch):.1f} us per empty batch")
p.close()
