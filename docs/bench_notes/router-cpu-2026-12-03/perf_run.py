"""perf record of one router (router_cpu's setting) over the run: its CPU by DSO."""
import argparse, asyncio, os, signal, subprocess, sys, time, tempfile
from pathlib import Path
from kvgate.tools.bench import router_cpu as rc
from kvgate.tools.bench.vllm_arena_client import converse
from kvgate.tools.bench.vllm_arena_setup import MODEL, warm_up
from kvgate.tools.bench.vllm_arena_cpu import tree_on_cpu_s
from kvgate.tools.bench.vllm_arena_workload import usable, user_texts
from kvgate.engines.vllm.launch import default_model_dir
p = argparse.ArgumentParser(); rc.add_arguments(p)
p.add_argument("--arm", default="kvgate_precise"); p.add_argument("--out", required=True)
args = p.parse_args(); args.tokenizer = str(default_model_dir())
convs, _ = usable(args)
texts = [user_texts(c, 64) for c in convs[: args.conversations]]
work = Path(tempfile.mkdtemp(prefix="lab3-"))
engines = rc.start_engines(args, args.tokenizer, work)
try:
    proc, url = rc.start_router(args.arm, "", engines, args, work)
    url += "/v1/chat/completions"
    asyncio.run(warm_up(url)); time.sleep(2)
    perf = subprocess.Popen(["perf", "record", "-F", "999", "-p", str(proc.proc.pid), "-o", args.out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    c0 = tree_on_cpu_s([proc.proc.pid])
    turns = asyncio.run(converse(url, texts, model=MODEL, max_tokens=16, concurrency=4))
    c1 = tree_on_cpu_s([proc.proc.pid])
    perf.send_signal(signal.SIGINT); perf.wait(60)
    print(args.arm, len(turns), "turns", round((c1 - c0) / len(turns) * 1e3, 3), "ms/request")
    proc.stop()
finally:
    for e in engines: e.proc.stop()
