import cProfile, pstats, sys, time
from kvgate.middleware.tags import entry_tags
from micro_setup import ANSWER as resp, pipeline, views as make_views

p, route = pipeline()
cache = p.cache
views = make_views(cache, route, 12000)
def run(vs, B=10):
    t = time.process_time()
    for s in range(0, len(vs), B):
        with cache._write_batch():
            for v in vs[s:s+B]:
                cache.index.add(v.scope, resp, exact_key=(v.exact_key if "NOX" not in __import__("os").environ else None), route="r", model="smollm2", tenant=v.tenant, tags=entry_tags(v))
    return (time.process_time() - t) / len(vs) * 1e6
print("warm", run(views[:2000]))
print("timed", run(views[2000:6000]))
if len(sys.argv) > 1:
    pr = cProfile.Profile(); pr.enable(); run(views[6000:10000]); pr.disable()
    st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(25)
else:
    print("timed", run(views[6000:10000]))
p.close()
