"""Ablation of the relay's cache path in process: which part costs what."""
import sys, argparse, json
from kvgate.tools.bench import pipeline_cpu as pc
from kvgate.middleware.server import heap
what = sys.argv[1]
target = sys.argv[2] if len(sys.argv) > 2 else "relay"
import kvgate.middleware.cache.response_cache as rc
import kvgate.index.responses.semantic as sem
import kvgate.middleware.cache.request_log as rl
if "nolog" in what:
    rc.ResponseCache.remember = lambda self, view, info: None
if "nostore" in what:
    orig = sem.SemanticIndex.add
    sem.SemanticIndex.add = lambda self, *a, **k: None
if "nolookup" in what:
    sem.SemanticIndex.get_exact = lambda self, key: None
if "gc" in what:
    orig_drive = pc._drive
    async def drive(args, app):
        import gc
        heap.settle_heap()
        return await orig_drive(args, app)
    pc._drive = drive
p = argparse.ArgumentParser(); pc.add_arguments(p)
args = p.parse_args(["--target", target, "--requests", "4000", *sys.argv[3:]])
r = pc.run(args)
print(what, target, r["cpu_ms_per_request"], r["errors"])
