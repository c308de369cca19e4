"""PrefixIndex.record per fresh chain and per re-recorded chain, by chain length (a 27,024-token prompt at
block sizes 16 / 64 / 128), the index warmed with as many blocks first. python prefbench3.py"""
import time, random, json, sys
from kvgate.index.kv.prefix import PrefixIndex
out = {}
for bs in (16, 64, 128):
    n = 27024 // bs
    idx = PrefixIndex(capacity_blocks=1 << 20); idx.add_replica("r0")
    rng = random.Random(bs)
    chains = [[rng.getrandbits(64) for _ in range(n)] for _ in range(2 * (120000 // n))]
    half = len(chains) // 2
    for c in chains[:half]: idx.record("r0", c)
    t = time.perf_counter()
    for c in chains[half:]: idx.record("r0", c)
    fresh = (time.perf_counter() - t) / half
    t = time.perf_counter()
    for c in chains[half:]: idx.record("r0", c)
    again = (time.perf_counter() - t) / half
    out[bs] = {"blocks": n, "fresh_ms": round(fresh * 1e3, 3), "again_ms": round(again * 1e3, 3)}
    print(bs, out[bs], flush=True)
if len(sys.argv) > 1: json.dump(out, open(sys.argv[1], "w"))
