import time, random
from collections import OrderedDict
from kvgate.index.kv.prefix_loops import loops, HOLDER_SHARDS
L = loops()
rng = random.Random(1)
chains = [[rng.getrandbits(64) for _ in range(422)] for _ in range(600)]
holders = [dict() for _ in range(HOLDER_SHARDS)]; succ = [dict() for _ in range(HOLDER_SHARDS)]
shards = [OrderedDict()]
F = object()
def run(name, f, cs):
    t = time.perf_counter()
    for c in cs: f(c)
    print(name, round((time.perf_counter() - t) / (len(cs) * 422) * 1e6, 3), "us/block")
run("insert warm", lambda c: L.insert(holders, shards, 1, c), chains[:300])
run("insert", lambda c: L.insert(holders, shards, 1, c), chains[300:])
run("retouch insert", lambda c: L.insert(holders, shards, 1, c), chains[300:])
run("link warm", lambda c: L.link(succ, c, F), chains[:300])
run("link", lambda c: L.link(succ, c, F), chains[300:])
d = {}
run("plain dict set", lambda c: [d.__setitem__(h, 1) for h in c], chains)
od = OrderedDict()
run("odict set", lambda c: [od.__setitem__(h, None) for h in c], chains)
run("odict move", lambda c: [od.move_to_end(h) for h in c], chains)
