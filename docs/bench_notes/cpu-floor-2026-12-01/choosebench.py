import time, sys
from kvgate.middleware.routing.base import ReplicaState, RoutePlan
from kvgate.middleware.routing.cache_aware import CacheAware
for n in (1, 2, 4):
    rs = [ReplicaState(f"r{i}", f"http://r{i}") for i in range(n)]
    for i, r in enumerate(rs): r.pending_prefill_tokens, r.in_flight = 100 * i, i
    p = RoutePlan(list(range(44)), 2800, 64, {f"r{i}": 10 * i for i in range(n)}, None, shared_prefix=True)
    pol = CacheAware()
    best = 1e9
    for _ in range(7):
        a = time.perf_counter()
        for _ in range(20000): pol.choose(rs, p)
        best = min(best, (time.perf_counter() - a) / 20000 * 1e6)
    print(sys.argv[1], n, "candidates", round(best, 2), "us")
