"""The native loops alone, per block: insert and link of fresh chains into tables holding ~120k blocks."""
import random, time
from kvgate.index.kv.prefix_loops import loops
from kvgate.index.kv.prefix_tables import new_tables
L = loops(); F = object()
for trial in range(2):
    holders, succ, new_lru = new_tables(L, F)
    shards = [new_lru() for _ in range(64)]
    rng = random.Random(trial)
    chains = [[rng.getrandbits(64) for _ in range(1689)] for _ in range(140)]
    for c in chains[:70]:
        L.link(succ, c, F); L.insert(holders, shards, 1, c)
    ti = tl = tw = 0.0
    for c in chains[70:]:
        t0 = time.perf_counter(); L.link(succ, c, F); t1 = time.perf_counter(); L.insert(holders, shards, 1, c); t2 = time.perf_counter()
        L.walk(holders, c, 0, 1); t3 = time.perf_counter()
        tl += t1 - t0; ti += t2 - t1; tw += t3 - t2
    n = 70 * 1689
    print(f"per block: link {tl/n*1e9:.0f} ns, insert {ti/n*1e9:.0f} ns, walk {tw/n*1e9:.0f} ns")
