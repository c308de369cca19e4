import gc, time, sys, argparse
from kvgate.tools.bench import pipeline_cpu as pc
from kvgate.middleware.server.heap import settle_heap
stats = {"t": 0.0, "n": [0, 0, 0], "start": 0.0}
def cb(phase, info):
    if phase == "start": stats["start"] = time.process_time()
    else:
        stats["t"] += time.process_time() - stats["start"]; stats["n"][info["generation"]] += 1
orig = pc._lifespan
async def lifespan(app):
    r = await orig(app)
    if "--freeze" in sys.argv: settle_heap()
    gc.callbacks.append(cb)
    return r
pc._lifespan = lifespan
p = argparse.ArgumentParser(); pc.add_arguments(p)
args = p.parse_args([a for a in sys.argv[1:] if a != "--freeze"])
row = pc.run(args)
n = args.requests + args.warmup
print(row["cpu_ms_per_request"], "ms/req;", "gc ms/req", round(stats["t"] / n * 1e3, 4), "collections", stats["n"], "threshold", gc.get_threshold())
