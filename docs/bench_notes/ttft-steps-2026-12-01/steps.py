"""Where a fresh 27k-character prompt's added TTFT goes: loop-load's route with timing_header on,
open loop at --rate; per request the server-timing steps, the head's wait and the first content's."""
import argparse, asyncio, statistics, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
import orjson, yaml
from kvgate.middleware.forward.http1 import Pool
from kvgate.tools.bench.loop_load import Prompts
from kvgate.tools.bench.loop_load_proxy import config
from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv
from kvgate.tools.bench.vllm_arena_cpu import timing_steps
from kvgate.tools.bench.stream_client import StreamScan

ap = argparse.ArgumentParser()
ap.add_argument("--rate", type=float, default=40); ap.add_argument("--n", type=int, default=600)
ap.add_argument("--shape", default="fresh"); ap.add_argument("--prompt-words", type=int, default=4180)
ap.add_argument("--conversations", type=int, default=20); ap.add_argument("--label", default=""); ap.add_argument("--floor", default=""); ap.add_argument("--stamped", default=""); ap.add_argument("--wrap", default="")
args = ap.parse_args()

async def one(client, url, messages, at, rows):
    await asyncio.sleep(max(0.0, at - time.perf_counter()))
    body = orjson.dumps({"model": "demo", "messages": messages, "stream": True, "max_tokens": 64})
    sent = time.perf_counter(); scan = StreamScan(); ttft = None
    resp = await client.post(url, body, {"content-type": "application/json"}, 60)
    head = time.perf_counter() - sent
    st = resp.headers.get("server-timing") if hasattr(resp, "headers") else None
    async for data in resp.chunks():
        if scan.feed(data) and ttft is None: ttft = time.perf_counter() - sent
    resp.close()
    rows.append((head, ttft, timing_steps(st) if st else {}))

async def phase(url, bodies, rate):
    client = Pool(keepalive_s=3.0, keep_headers=frozenset({"server-timing"})); rows = []
    t0 = time.perf_counter() + 0.2
    await asyncio.gather(*(one(client, url, m, t0 + i / rate, rows) for i, m in enumerate(bodies)))
    await client.aclose(); return rows

def pct(xs, q): xs = sorted(xs); return xs[min(len(xs) - 1, int(q * len(xs)))]
work = Path(tempfile.mkdtemp(prefix="kvgate-steps-"))
port = free_port(); burl = f"http://127.0.0.1:{port}"
backend = Proc("demo", kvgate_argv("demo-backend", "--port", str(port)), work)
try:
    backend.wait_http(f"{burl}/v1/models")
    cfg = config([burl], "text", str(work / "cache"), 64); cfg["server"]["timing_header"] = True
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    pport = free_port(); purl = f"http://127.0.0.1:{pport}"
    if args.stamped:
        proxy = Proc("proxy", [sys.executable, str(HERE / "stamped_serve.py"), str(work / "c.yaml"), str(pport), args.stamped, *[w for w in args.wrap.split(",") if w]], work)
    elif args.floor:
        proxy = Proc("proxy", [sys.executable, str(HERE.parent / "cpu-floor-2026-12-01" / "floor_server.py"), args.floor, str(pport), burl], work)
    else:
        proxy = Proc("proxy", kvgate_argv("serve", "--config", str(work / "c.yaml"), "--port", str(pport), "--log-level", "warning"), work)
    try:
        import time as _t
        for _ in range(100):
            try:
                import httpx; httpx.get(purl + "/health", timeout=1); break
            except Exception: _t.sleep(0.2)
        pr = Prompts(args.shape, args, args.n, seed=100)
        warm = pr.warm or Prompts("fresh", args, 8, seed=9).bodies
        out = {}
        for label, url in (("direct", burl), ("proxy", purl)):
            asyncio.run(phase(f"{url}/v1/chat/completions", warm, args.rate))
            out[label] = asyncio.run(phase(f"{url}/v1/chat/completions", pr.bodies, args.rate))
    finally:
        proxy.stop()
finally:
    backend.stop()
d, p = out["direct"], out["proxy"]
print(f"{args.label} {args.shape}: ttft direct p50 {pct([r[1] for r in d],.5)*1e3:.2f} p99 {pct([r[1] for r in d],.99)*1e3:.2f}; "
      f"proxy p50 {pct([r[1] for r in p],.5)*1e3:.2f} p99 {pct([r[1] for r in p],.99)*1e3:.2f}")
steps = {k: [r[2].get(k, 0.0) for r in p] for k in ("read", "hop", "cache", "prefix", "route", "engine", "relay")}
steps["head-steps(outside)"] = [r[0] * 1e3 - sum(r[2].values()) for r in p]
steps["after head"] = [(r[1] - r[0]) * 1e3 for r in p]
steps["direct head"] = [r[0] * 1e3 for r in d]; steps["direct after head"] = [(r[1] - r[0]) * 1e3 for r in d]
import json as _j
if args.label:
    _j.dump({"shape": args.shape, "rate": args.rate, "n": args.n, "prompt_words": args.prompt_words, "floor": args.floor,
             "direct_ttft_ms": [r[1] * 1e3 for r in d], "proxy_ttft_ms": [r[1] * 1e3 for r in p],
             "steps_ms": steps}, open(f"steps-{args.label}.json", "w"))
print(f"  added ttft p50 {(pct([r[1] for r in p],.5)-pct([r[1] for r in d],.5))*1e3:.2f} p99 {(pct([r[1] for r in p],.99)-pct([r[1] for r in d],.99))*1e3:.2f} ms")
for k, xs in steps.items():
    print(f"  {k:22s} mean {statistics.fmean(xs):6.2f}  p50 {pct(xs,.5):6.2f}  p90 {pct(xs,.9):6.2f}  p99 {pct(xs,.99):6.2f} ms")
