"""WAL frames per commit of a batch of four misses, each store's database apart, in both layouts of proto.py (run beside it)."""
import os, sys
exec(open("proto.py").read().split("nid = [0]")[0])
nid = [0]
exec("\n".join(l for l in open("proto.py").read().split("nid = [0]")[1].split("def go")[0].splitlines()))
def walsize(c): 
    p = os.path.join(c.directory, "cache.db-wal"); return os.path.getsize(p) if os.path.exists(p) else 0
e, r = mk()
for c in (e, r): c._con.execute("PRAGMA wal_autocheckpoint=100000")
for _ in range(500): cur(e, r, 4)
for name, fn in (("cur", cur), ("lean", lean)):
    for c in (e, r): c._con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    # WAL restarts from the beginning after a truncate checkpoint
    for _ in range(100): fn(e, r, 4)
    print(name, "frames per batch of 4: entries", walsize(e) / 4120 / 100, "requests", walsize(r) / 4120 / 100)
print(e._con.execute("PRAGMA auto_vacuum").fetchone(), e._con.execute("PRAGMA page_count").fetchone())
