import time
from kvgate.middleware.tags import entry_tags
from micro_setup import ANSWER as resp, pipeline, views as make_views

p, route = pipeline()
cache = p.cache
views = make_views(cache, route, 8000)
def run(vs, B=10):
    body = commit = begin = 0.0
    for s in range(0, len(vs), B):
        t0 = time.process_time()
        with cache._write_batch():
            t1 = time.process_time()
            for v in vs[s:s+B]:
                cache.index.add(v.scope, resp, exact_key=v.exact_key, route="r", model="smollm2", tenant=v.tenant, tags=entry_tags(v))
            t2 = time.process_time()
        t3 = time.process_time()
        begin += t1 - t0; body += t2 - t1; commit += t3 - t2
    n = len(vs)
    return f"begin {begin/n*1e6:.1f} body {body/n*1e6:.1f} commit {commit/n*1e6:.1f} us per entry"
print(run(views[:2000]))
print(run(views[2000:5000]))
print(run(views[5000:8000]))
p.close()
