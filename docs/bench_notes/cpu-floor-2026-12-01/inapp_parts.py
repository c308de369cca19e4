"""Wall time inside chosen functions per request, in pipeline_cpu (sync functions only). The default
set has none nested in another; `--finish` times the answer's bookkeeping, nested (each figure
includes what it calls that is also timed)."""
import sys, time, argparse, importlib, collections, functools
from kvgate.tools.bench import pipeline_cpu as pc
PARTS = [
 ("kvgate.index.kv.prompt", "PromptHasher.prompt"),
 ("kvgate.middleware.forward.relay_events", "SseParser.feed"),
 ("kvgate.middleware.server.body", "_parse_body"),
 ("kvgate.middleware.request", "build_view"),
 ("kvgate.middleware.routing.router", "Router.choose"),
 ("kvgate.middleware.routing.router", "Router.started"),
 ("kvgate.middleware.routing.router", "Router.finished"),
 ("kvgate.index.kv.prefix", "PrefixIndex.match"),
 ("kvgate.middleware.forward.http1", "request_head"),
 ("kvgate.middleware.forward.http1", "Connection.begin"),
 ("kvgate.middleware.forward.http1", "Connection.data_received"),
 ("kvgate.middleware.cache.response_cache", "ResponseCache.record"),
 ("kvgate.middleware.cache.response_cache", "ResponseCache.miss"),
]

FINISH = [
 ("kvgate.middleware.routing.router", "Router.finished"),
 ("kvgate.middleware.routing.router", "Router.started"),
 ("kvgate.middleware.routing.router", "Router.first_token"),
 ("kvgate.middleware.routing.records", "Records.record"),
 ("kvgate.index.kv.prefix", "PrefixIndex.record"),
 ("kvgate.middleware.routing.state_local", "LocalState.add_load"),
 ("kvgate.middleware.routing.state_local", "LocalState.recorded"),
 ("kvgate.middleware.routing.health", "ReplicaHealth.mark_up"),
 ("kvgate.middleware.forward.forwarder", "Forwarder.done"),
 ("kvgate.middleware.forward.forwarder", "Forwarder.hash_answer"),
 ("kvgate.middleware.forward.failover", "Failover.done"),
]
TARGETS = FINISH if "--finish" in sys.argv else PARTS
if "--finish" in sys.argv:
    sys.argv.remove("--finish")
acc = collections.Counter(); cnt = collections.Counter()
tt = time.perf_counter
def wrap(name, f):
    @functools.wraps(f)
    def w(*a, **k):
        t = tt()
        try:
            return f(*a, **k)
        finally:
            acc[name] += tt() - t; cnt[name] += 1
    return w
for mod, attr in TARGETS:
    m = importlib.import_module(mod)
    obj = m
    parts = attr.split(".")
    for p in parts[:-1]: obj = getattr(obj, p)
    setattr(obj, parts[-1], wrap(attr, getattr(obj, parts[-1])))
    if len(parts) == 1:  # also patch importers that did `from m import f`
        for other in list(sys.modules.values()):
            if other is not None and getattr(other, parts[0], None) is getattr(m, parts[0]).__wrapped__:
                setattr(other, parts[0], getattr(m, parts[0]))
class P:
    def enable(self): acc.clear(); cnt.clear()
    def disable(self): pass
    def dump_stats(self, p): pass
pc.cProfile.Profile = P
ap = argparse.ArgumentParser(); pc.add_arguments(ap); args = ap.parse_args()
args.profile = "x"
r = pc.run(args)
print("cpu ms/request (with wrappers)", r["cpu_ms_per_request"])
for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
    print(f"{v/args.requests*1e6:7.1f} us/req  {cnt[k]/args.requests:5.2f} calls/req  {k}")
