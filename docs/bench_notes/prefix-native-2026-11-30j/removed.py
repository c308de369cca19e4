"""PrefixIndex.removed per block: an engine's removal events for 1,689-block chains (one replica,
as precise mode's applier sends them), on an index holding ~120k blocks."""
import random, time
from kvgate.index.kv.prefix import PrefixIndex
for run in range(2):
    idx = PrefixIndex(capacity_blocks=1 << 18, touch_on_match=True); idx.add_replica("r0"); idx.add_replica("r1")
    rng = random.Random(run)
    chains = [[rng.getrandbits(64) for _ in range(1689)] for _ in range(140)]
    for c in chains: idx.stored("r0", c)
    t = time.perf_counter()
    for c in chains[70:]: idx.removed("r0", c)
    dt = (time.perf_counter() - t) / 70
    print(f"removed: {dt*1e3:.3f} ms per 1,689-block chain, {dt/1689*1e9:.0f} ns per block", flush=True)
