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
shape, n = sys.argv[1], int(sys.argv[2]); prof = sys.argv[3] if len(sys.argv) > 3 else None
conc = 1
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
cfg["server"]["timing_header"] = True
p = work / "c.yaml"; p.write_text(yaml.safe_dump(cfg))
app = create_app(load_config(p))
async def drive():
    task, inbox = await _lifespan(app)
    caller = Caller(app.lean)
    import time as _t
    firsts = []; timings = []
    orig_call = Caller.__call__
    class TCaller(Caller):
        async def __call__(self, body):
            t0 = _t.perf_counter(); got = [None]
            app0 = self.app
            async def wrapped(scope, receive, send):
                async def s2(m):
                    if m["type"] == "http.response.start":
                        for k, v in m.get("headers", []):
                            if k.lower() == b"server-timing": timings.append(v.decode())
                    if m["type"] == "http.response.body" and got[0] is None and m.get("body"):
                        got[0] = _t.perf_counter() - t0
                    await send(m)
                await app0(scope, receive, s2)
            self.app = wrapped
            try: await orig_call(self, body)
            finally: self.app = app0
            firsts.append(got[0])
    caller = TCaller(app.lean)
    bodies = [orjson.dumps({"model": "demo", "messages": m, "stream": True, "max_tokens": 64}) for m in prompts.warm + prompts.bodies]
    warm = len(prompts.warm) + 40
    async def go(bs):
        it = iter(bs)
        async def w():
            for b in it: await caller(b)
        await asyncio.gather(*(w() for _ in range(conc)))
    await go(bodies[:warm])
    pr = cProfile.Profile() if prof else None
    c0 = time.process_time()
    if pr: pr.enable()
    await go(bodies[warm:])
    if pr: pr.disable(); pr.dump_stats(prof)
    c = time.process_time() - c0
    await asyncio.sleep(1.0)
    c2 = time.process_time() - c0
    import statistics as st
    fs = sorted(firsts[-n:]); print("first byte ms p50", round(fs[len(fs)//2]*1e3,3), "p90", round(fs[int(len(fs)*0.9)]*1e3,3), "p99", round(fs[int(len(fs)*0.99)]*1e3,3))
    import collections, re as _re
    agg = collections.defaultdict(list)
    for t in timings[-n:]:
        for part in t.split(", "):
            name, dur = part.split(";dur=")
            agg[name].append(float(dur))
    print({k: round(sorted(v)[len(v)//2], 3) for k, v in agg.items()}, "p50 ms per step")
    print(shape, "cpu ms/req", round(c / n * 1e3, 3), "incl 1s after", round(c2 / n * 1e3, 3), "bad", caller.bad)
    await inbox.put({"type": "lifespan.shutdown"}); await task
try:
    uvloop.run(drive())
finally:
    backend.stop()
