import time, sys, random
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import TextTokenizer
from kvgate.index.kv.prefix import PrefixIndex
h = PromptHasher(TextTokenizer(), 64)
rng = random.Random(0)
W = "amber basalt cinder delta ember fjord garnet harbor indigo juniper kelp lagoon".split()
sysw = "You are assistant 1. " + " ".join(rng.choices(W, k=400))
def conv(i):
    q = f"q{i}: " + " ".join(rng.choices(W, k=14))
    return [{"role": "system", "content": sysw}, {"role": "user", "content": q}], "Answer 1: " + q
h.prompt(conv(0)[0])
N = 3000
cs = [conv(i) for i in range(N)]
idx = PrefixIndex(); idx.add_replica("r0")
def run():
    t = {"plan": 0.0, "answer": 0.0, "rec": 0.0}
    for msgs, ans in cs:
        a = time.process_time(); p = h.prompt(msgs); b = time.process_time()
        full = h.prompt(msgs + [{"role": "assistant", "content": ans}], p); c = time.process_time()
        idx.record("r0", full.hashes); d = time.process_time()
        t["plan"] += b - a; t["answer"] += c - b; t["rec"] += d - c
    return {k: round(v / N * 1e6, 1) for k, v in t.items()}, len(full.hashes)
for _ in range(3): print(sys.argv[1] if len(sys.argv) > 1 else "", run())
