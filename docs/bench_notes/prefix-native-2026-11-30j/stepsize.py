"""PrefixIndex.record of 27,024-token chains at 16-token blocks (1,689 blocks) by record_step, the index warmed with as many blocks first."""
import random, time, sys
from kvgate.index.kv.prefix import PrefixIndex
for rep in range(2):
  for step in (128, 256, 512, 10**9):
    idx = PrefixIndex(capacity_blocks=1 << 20, record_step=step); idx.add_replica("r0")
    rng = random.Random(rep)
    chains = [[rng.getrandbits(64) for _ in range(1689)] for _ in range(140)]
    for c in chains[:70]: idx.record("r0", c)
    t = time.perf_counter()
    for c in chains[70:]: idx.record("r0", c)
    fresh = (time.perf_counter() - t) / 70
    t = time.perf_counter()
    for c in chains[70:]: idx.record("r0", c)
    again = (time.perf_counter() - t) / 70
    print(step, f"fresh {fresh*1e3:.3f} ms again {again*1e3:.3f} ms", flush=True)
