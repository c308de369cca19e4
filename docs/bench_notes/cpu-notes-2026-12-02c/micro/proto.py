"""A small miss's writes as the relay's group commit makes them, in batches of B, timed alone:
`current` is the layout of today's stores (four diskcache rows per entry: the entry, its tenant and
system-prompt index rows, its exact pointer, after a look-up of that pointer; one row per
request-log record in the log's own database, committed with it); `lean` puts the pointer, the
index rows and the record in plain WITHOUT ROWID tables of the entries' database (one B-tree
insert each, no trigger-kept counters, one commit). A prototype of a layout, not kvgate's code."""
import time, secrets, tempfile, sys
import diskcache
from kvgate.index.storage.disk_sql import put_ints, get_int
from kvgate.index.storage.sealed import SealedDisk, seal
ENTRY = b"e" * 900
REC = b'{"tenant":"anonymous","route":"bench","tier":"miss","scope":"' + b"a"*64 + b'","entry_id":123456,"similarity":null,"created":1764662400.123}'
def mk():
    d = tempfile.mkdtemp()
    e = diskcache.Cache(d + "/responses", eviction_policy="none", size_limit=2**62, disk=SealedDisk, sqlite_secure_delete=1)
    r = diskcache.Cache(d + "/requests", eviction_policy="least-recently-stored", sqlite_secure_delete=1)
    e._con.execute("CREATE TABLE IF NOT EXISTS kx(key TEXT PRIMARY KEY, id INTEGER NOT NULL, expire REAL) WITHOUT ROWID")
    e._con.execute("CREATE TABLE IF NOT EXISTS kt(term TEXT, id INTEGER, expire REAL, PRIMARY KEY(term, id)) WITHOUT ROWID")
    e._con.execute("CREATE TABLE IF NOT EXISTS kr(rid TEXT PRIMARY KEY, rec BLOB, stored REAL, expire REAL) WITHOUT ROWID")
    return e, r
nid = [0]
def cur(e, r, B):
    with e.transact(), r.transact():
        recs = {}
        for _ in range(B):
            nid[0] += 1; i = nid[0]; x = secrets.token_hex(32)
            get_int(e, "x:" + x)
            put_ints(e, {f"e:{i}": seal(ENTRY), f"g:tenant-abc|{i}": 1, f"g:sys-def|{i}": 1, f"x:{x}": i}, None)
            recs["kvg-" + secrets.token_hex(16)] = REC
        put_ints(r, recs, 86400)
def lean(e, r, B):
    con = e._con
    with e.transact():
        now = time.time(); ex = []; te = []; rr = []
        for _ in range(B):
            nid[0] += 1; i = nid[0]; x = secrets.token_hex(32)
            con.execute("SELECT id FROM kx WHERE key = ?", (x,)).fetchone()
            put_ints(e, {f"e:{i}": seal(ENTRY)}, None)
            con.execute("INSERT OR REPLACE INTO kx VALUES (?, ?, NULL)", (x, i))
            con.executemany("INSERT OR REPLACE INTO kt VALUES (?, ?, NULL)", (("tenant-abc", i), ("sys-def", i)))
            rr.append(("kvg-" + secrets.token_hex(16), REC, now, now + 86400))
        con.executemany("INSERT OR REPLACE INTO kr VALUES (?, ?, ?, ?)", rr)
def go(fn, B, N=6000):
    e, r = mk()
    for _ in range(2000 // B): fn(e, r, B)
    t = time.process_time()
    for s in range(N // B): fn(e, r, B)
    return (time.process_time() - t) / (N // B * B) * 1e6
for rnd in range(2):
    for B in (4, 16, 32, 64):
        print(f"B={B} current {go(cur, B):.1f}  lean {go(lean, B):.1f} us/miss")
