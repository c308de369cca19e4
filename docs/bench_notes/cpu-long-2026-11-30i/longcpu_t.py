"""In-process CPU per request for loop-load's fresh/continue long prompts (27k text tokens), exact tier on.
python longcpu.py [fresh|continue] N [profile_path]"""
import argparse, asyncio, sys, tempfile, time, cProfile, yaml, orjson
from pathlib import Path
from kvgate.middleware.config import load_config, PrefixConfig
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv
from kvgate.tools.bench.throughput_servers import wait_ready
from kvgate.tools.bench.pipeline_cpu import Caller, _lifespan
from kvgate.tools.bench.loop_load import Prompts
from kvgate.tools.bench.loop_load_proxy import config as llconfig
import uvloop
sys.path.insert(0, '/work/b51'); import timers
for m, q in [("kvgate.middleware.steps", "look_up"), ("kvgate.middleware.cache.response_cache", "ResponseCache.record"),
  ("kvgate.middleware.cache.response_cache", "ResponseCache.store"), ("kvgate.middleware.cache.response_cache", "ResponseCache.remember"),
  ("kvgate.middleware.routing.records", "Records._apply"), ("kvgate.index.kv.prompt", "PromptHashes.complete"),
  ("kvgate.index.kv.prompt", "PromptHasher.prompt"), ("kvgate.middleware.request", "build_view"), ("kvgate.middleware.routing.planner", "Planner.plan"),
  ("kvgate.index.kv.prefix", "PrefixIndex.record"), ("kvgate.middleware.canonical", "digest"), ("kvgate.middleware.canonical", "canonical_json"),
  ("kvgate.middleware.routing.planner", "Planner.answer_hashes"), ("kvgate.index.responses.semantic", "SemanticIndex.add"),
  ("kvgate.middleware.cache.response_cache", "ResponseCache.look_up")]:
    try: timers.wrap(m, q)
    except Exception as e: print("no", m, q, e)
shape, n = sys.argv[1], int(sys.argv[2]); prof = sys.argv[3] if len(sys.argv) > 3 else None
conc = 4
args = argparse.Namespace(prompt_words=4180, conversations=20)
prompts = Prompts(shape, args, n + 40, 7)
work = Path(tempfile.mkdtemp(prefix="longcpu-"))
port = free_port()
backend = Proc("backend", kvgate_argv("demo-backend", "--port", str(port)), work)
url = f"http://127.0.0.1:{port}"
wait_ready(backend, url)
bs = PrefixConfig(tokenizer="text").block_size
cfg = llconfig([url], "text", str(work / "cache"), bs)
import os
if os.environ.get("NOEXACT"): cfg["routes"][0]["exact"] = False
if os.environ.get("NOANS"): cfg["routes"][0]["routing"]["prefix"]["record_answers"] = False
if os.environ.get("TOK"): cfg["routes"][0]["routing"]["prefix"]["tokenizer"] = os.environ["TOK"]
p = work / "c.yaml"; p.write_text(yaml.safe_dump(cfg))
app = create_app(load_config(p))
async def drive():
    task, inbox = await _lifespan(app)
    caller = Caller(app.lean)
    bodies = [orjson.dumps({"model": "demo", "messages": m, "stream": True, "max_tokens": 64}) for m in prompts.warm + prompts.bodies]
    warm = len(prompts.warm) + 40
    async def go(bs):
        it = iter(bs)
        async def w():
            for b in it: await caller(b)
        await asyncio.gather(*(w() for _ in range(conc)))
    await go(bodies[:warm])
    timers.acc.clear(); timers.calls.clear()
    pr = cProfile.Profile() if prof else None
    c0 = time.process_time()
    if pr: pr.enable()
    await go(bodies[warm:])
    if pr: pr.disable(); pr.dump_stats(prof)
    c = time.process_time() - c0
    await asyncio.sleep(1.0)
    c2 = time.process_time() - c0
    timers.acc.clear() if False else None
    print(shape, "cpu ms/req", round(c / n * 1e3, 3), "incl 1s after", round(c2 / n * 1e3, 3), "bad", caller.bad)
    timers.report(n)
    await inbox.put({"type": "lifespan.shutdown"}); await task
try:
    uvloop.run(drive())
finally:
    backend.stop()
