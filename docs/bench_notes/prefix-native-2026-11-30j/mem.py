"""Memory per block of a PrefixIndex: one replica at EVENT_FED_CAPACITY's order, 500k blocks in chains of 400, RSS before and after (the hashes' own ints freed with the chains)."""
import random, resource, sys, gc
from kvgate.index.kv.prefix import PrefixIndex
from kvgate.index.kv.prefix_loops import python_loops, loops
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096
mod = python_loops() if sys.argv[1] == "python" else loops()
idx = PrefixIndex(1 << 20, chain_loops=mod); idx.add_replica("a")
rng = random.Random(1); gc.collect(); before = rss()
for _ in range(1250):
    idx.record("a", [rng.getrandbits(64) for _ in range(400)])
gc.collect(); after = rss()
print(sys.argv[1], idx.stats()["unique_blocks"], "blocks", round((after - before) / idx.stats()["unique_blocks"]), "bytes per block")
