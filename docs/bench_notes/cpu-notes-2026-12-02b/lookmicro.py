"""A small miss's cache parts timed alone: the request's keys, an exact look-up that misses, and
an entry's write and the request-log record in batches of ten (first-time keys)."""

import statistics
import time

from micro_setup import ANSWER, body, pipeline, views

from kvgate.index.storage.disk_sql import get_int
from kvgate.middleware.cache.request_log import RequestRecord, new_request_id
from kvgate.middleware.tags import entry_tags

p, route = pipeline()
cache = p.cache
for v in views(cache, route, 3000, "fill"):  # an index that holds something
    cache.index.add(v.scope, ANSWER, exact_key=v.exact_key)
missing = views(cache, route, 5000)
entries = cache.index.entries
for name, fn in (
    ("view", lambda v: cache.view(route, body("q"))),
    ("lookup_exact", cache.lookup_exact),
    ("index.get_exact", lambda v: cache.index.get_exact(v.exact_key)),
    ("entries.get_exact", lambda v: entries.get_exact(v.exact_key)),
    ("get_int", lambda v: get_int(entries.cache, "x:" + v.exact_key)),
):
    rounds = []
    for _ in range(5):
        t = time.process_time()
        for v in missing:
            fn(v)
        rounds.append((time.process_time() - t) / len(missing) * 1e6)
    print(f"{name:20s} {statistics.median(rounds):6.1f} us")


def batches(kind: str, vs: list, size: int = 10) -> float:
    t = time.process_time()
    for s in range(0, len(vs), size):
        with cache._write_batch():
            for v in vs[s : s + size]:
                if "add" in kind:
                    cache.index.add(v.scope, ANSWER, exact_key=v.exact_key, route="r", model="smollm2", tenant=v.tenant, tags=entry_tags(v))
                if "log" in kind:
                    cache.requests.record(new_request_id(), RequestRecord(v.tenant, "r", "miss", v.scope, 5, None))
    return (time.process_time() - t) / len(vs) * 1e6


for kind in ("empty", "add", "log", "add+log"):
    print(f"batch of 10: {kind:8s} {batches(kind, views(cache, route, 2000)):6.1f} us per request")
p.close()
