import time, random, sys, msgspec, argparse
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import TextTokenizer
from kvgate.tools.bench.throughput import Workload, add_arguments
ap = argparse.ArgumentParser(); add_arguments(ap); args = ap.parse_args([])
h = PromptHasher(TextTokenizer(), int(sys.argv[1]) if len(sys.argv) > 1 else 64)
w = Workload("cpu", args, 1)
N = 3000
bodies = [msgspec.json.decode(w.body(w.new())) for _ in range(N)]
def run():
    a = time.perf_counter()
    for b in bodies:
        m = b["messages"]
        p = h.prompt(m)
        h.prompt(m + [{"role": "assistant", "content": "Answer 12: " + m[1]["content"]}], p)
    return (time.perf_counter() - a) / N * 1e6
for _ in range(3):
    print(round(run(), 1), "us for 2 calls;", len(h.prompt(bodies[0]["messages"]).hashes), "blocks")
    bodies = [msgspec.json.decode(w.body(w.new())) for _ in range(N)]
