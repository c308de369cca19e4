"""WAL frames (pages written) per commit of four misses' entry rows, by kind of row: `e` the
entry, `g` its two index rows, `x` its exact pointer (random keys); av = SQLite's auto_vacuum
(diskcache's default is 1). Each frame is two pwrite calls of SQLite's."""
import os, sys, time, secrets, tempfile
import diskcache
from kvgate.index.storage.disk_sql import put_ints, get_int
from kvgate.index.storage.sealed import SealedDisk, seal
ENTRY = b"e" * 900
def walsize(c):
    p = os.path.join(c.directory, "cache.db-wal"); return os.path.getsize(p) if os.path.exists(p) else 0
def run(av, kinds, B=4, pre=2000, n=100):
    d = tempfile.mkdtemp()
    e = diskcache.Cache(d, eviction_policy="none", size_limit=2**62, disk=SealedDisk, sqlite_secure_delete=1, sqlite_auto_vacuum=av)
    e._con.execute("PRAGMA wal_autocheckpoint=100000")
    i = 0
    def batch():
        nonlocal i
        with e.transact():
            for _ in range(B):
                i += 1; rows = {}
                if "e" in kinds: rows[f"e:{i}"] = seal(ENTRY)
                if "g" in kinds: rows[f"g:tenant-abc|{i}"] = 1; rows[f"g:sys-def|{i}"] = 1
                if "x" in kinds: rows["x:" + secrets.token_hex(32)] = i
                put_ints(e, rows, None)
    for _ in range(pre // B): batch()
    e._con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for _ in range(n): batch()
    fr = walsize(e) / 4120 / n
    t = time.process_time()
    for _ in range(500): batch()
    us = (time.process_time() - t) / 500 / B * 1e6
    return f"av={av} kinds={kinds:4} frames/batch {fr:5.2f}  {us:.1f} us/miss (checkpoint-free WAL growth)"
for av in (1, 0):
    for kinds in ("egx", "e", "g", "x", "eg"):
        print(run(av, kinds))
