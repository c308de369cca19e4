import time, msgspec, argparse, orjson, hashlib, json, random
from kvgate.middleware.server.schema import ChatCompletionRequest
from kvgate.tools.bench.throughput import Workload, add_arguments
ap = argparse.ArgumentParser(); add_arguments(ap); args = ap.parse_args([])
w = Workload("cpu", args, 1)
raws = [w.body(w.new()) for _ in range(3000)]
bodies = [msgspec.json.decode(r) for r in raws]
junk = [bytes(random.getrandbits(8) for _ in range(64)) * 4 for _ in range(2000)]
big = {i: str(i) for i in range(200000)}
def polluter(i):
    # touch varied code and data, as the rest of a request would
    json.dumps({"a": [1, 2, 3], "b": "x" * 50})
    orjson.loads(raws[i])
    hashlib.sha256(junk[i % 2000]).digest()
    s = 0
    for k in range(0, 200000, 997): s += len(big[(k * 7919 + i) % 200000])
    sorted(range(50, 0, -1))
def run(pollute):
    tot = 0.0
    for i, b in enumerate(bodies):
        if pollute: polluter(i)
        a = time.perf_counter(); ChatCompletionRequest.model_validate(b); tot += time.perf_counter() - a
    return tot / len(bodies) * 1e6
for _ in range(3):
    print("alone %.2f us   polluted %.2f us" % (run(False), run(True)))
