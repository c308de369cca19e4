"""Precise mode's in-flight bookkeeping per request (InFlightPrefixes: sent, done, the expiry after
the grace period), 1,689-block chains (a 27k-token prompt at 16-token blocks), 20 conversations."""
import random, time
from kvgate.index.kv.prefix import PrefixIndex
from kvgate.middleware.routing.inflight import InFlightPrefixes
now = [0.0]
for run in range(2):
    idx = PrefixIndex(capacity_blocks=1 << 18, touch_on_match=True); idx.add_replica("r0")
    inf = InFlightPrefixes(idx, clock=lambda: now[0])
    rng = random.Random(run)
    chains = [[rng.getrandbits(64) for _ in range(1689)] for _ in range(20)]
    ts = td = te = 0.0
    for i in range(400):
        c = chains[i % 20]
        t0 = time.perf_counter(); inf.sent("r0", c); t1 = time.perf_counter(); inf.done("r0", c); t2 = time.perf_counter()
        now[0] += 0.1
        t3 = time.perf_counter(); inf.expire(); t4 = time.perf_counter()
        ts += t1 - t0; td += t2 - t1; te += t4 - t3
    print(f"sent {ts/400*1e3:.3f} ms, done {td/400*1e3:.3f} ms, expire {te/400*1e3:.3f} ms per request", flush=True)
