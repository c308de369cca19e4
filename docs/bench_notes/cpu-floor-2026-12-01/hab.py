import time, sys, msgspec, argparse, gc
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import TextTokenizer
from kvgate.tools.bench.throughput import Workload, add_arguments
ap = argparse.ArgumentParser(); add_arguments(ap); args = ap.parse_args([])
h = PromptHasher(TextTokenizer(), 64)
w = Workload("cpu", args, 1)
N = 2000
def run(reuse):
    bodies = [msgspec.json.decode(w.body(w.new())) for _ in range(N)]
    tot = 0.0
    for b in bodies:
        m = b["messages"]
        p = h.prompt(m)
        if not reuse: p.segments = None
        conv = m + [{"role": "assistant", "content": "Answer 12: " + m[1]["content"]}]
        a = time.perf_counter()
        h.prompt(conv, p)
        tot += time.perf_counter() - a
    return tot / N * 1e6
res = {True: [], False: []}
for i in range(16):
    for r in (True, False): res[r].append(run(r))
for r in (True, False): print("reuse" if r else "full ", "answer call min %.2f median %.2f us" % (min(res[r]), sorted(res[r])[8]))
