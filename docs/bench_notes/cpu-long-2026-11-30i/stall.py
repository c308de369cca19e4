"""How long a router's `match` waits behind long records: a thread records fresh chains of a
27,024-token prompt's blocks (block size from argv: 16, 64, 128) back to back, as the recorder
thread does; this thread matches a 64-block chain every millisecond and times each call
(perf_counter), for 5 s. Prints the match's p50 / p99 / max in ms, and the same with no recorder.
A second argument sets the GIL switch interval in seconds (CPython: 0.005).
python stall.py 16 [0.0005]"""
import random, sys, threading, time
from kvgate.index.kv.prefix import PrefixIndex

bs = int(sys.argv[1]) if len(sys.argv) > 1 else 16
if len(sys.argv) > 2:
    sys.setswitchinterval(float(sys.argv[2]))
n = 27024 // bs
rng = random.Random(bs)
idx = PrefixIndex(capacity_blocks=1 << 20)
idx.add_replica("r0")
idx.add_replica("r1")
probe = [rng.getrandbits(64) for _ in range(64)]
idx.record("r1", probe)
for _ in range(120000 // n):  # an index already holding as many blocks
    idx.record("r0", [rng.getrandbits(64) for _ in range(n)])


def timed(seconds: float, busy: bool) -> list[float]:
    stop = threading.Event()
    chains = [[rng.getrandbits(64) for _ in range(n)] for _ in range(40)]

    def recorder() -> None:
        i = 0
        while not stop.is_set():
            idx.record("r0", chains[i % len(chains)] if i % 2 else [rng.getrandbits(64) for _ in range(n)])
            i += 1

    t = threading.Thread(target=recorder) if busy else None
    if t:
        t.start()
    out, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        idx.match(probe)
        out.append(time.perf_counter() - t0)
        time.sleep(0.001)
    stop.set()
    if t:
        t.join()
    return sorted(out)


for busy in (False, True):
    xs = timed(5.0, busy)
    q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))] * 1e3
    print(f"block {bs} ({n} blocks) recorder {'on ' if busy else 'off'}: match p50 {q(0.5):.3f} p99 {q(0.99):.3f} max {xs[-1]*1e3:.3f} ms over {len(xs)}")
