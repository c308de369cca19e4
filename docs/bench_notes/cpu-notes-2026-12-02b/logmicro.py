import time, tempfile, secrets, sys
from pathlib import Path
from kvgate.middleware.cache.request_log import DiskRequestLog, RequestRecord
def rid_rand(): return "kvg-" + secrets.token_hex(16)
def rid_time(): return f"kvg-{time.time_ns()//1_000_000:012x}{secrets.token_hex(16)}"
for name, rid in (("rand", rid_rand), ("time", rid_time), ("rand", rid_rand), ("time", rid_time)):
    d = Path(tempfile.mkdtemp())
    log = DiskRequestLog(d, ttl=3600, max_bytes=2**30)
    rec = RequestRecord("tenant-hash"*4, "bench", "miss", "scope"*12, 17)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    for _ in range(300):
        with log.batch():
            for _ in range(n): log.record(rid(), rec)
    c, w = time.process_time(), time.perf_counter()
    B = 600
    for _ in range(B):
        with log.batch():
            for _ in range(n): log.record(rid(), rec)
    c, w = time.process_time()-c, time.perf_counter()-w
    print(name, n, f"cpu {c/B/n*1e6:.1f} us/record, wall {w/B/n*1e6:.1f}", len(log))
    log.close()
