import argparse, asyncio, json, os, sys, tempfile, time
from pathlib import Path
from kvgate.tools.bench import throughput as T
from kvgate.tools.bench.procs import Proc, free_port, group_cpu_s, kvgate_argv
from kvgate.tools.bench.throughput_servers import start, wait_ready

ap = argparse.ArgumentParser(); T.add_arguments(ap)
ap.add_argument("--floors", default="canned,relay,raw")
args = ap.parse_args()
work = Path(tempfile.mkdtemp(prefix="floor-"))
bport = free_port(); backend = f"http://127.0.0.1:{bport}"
procs = [Proc("backend", kvgate_argv("demo-backend", "--port", str(bport)), work)]
procs[0].wait_http(f"{backend}/health")
targets = {}
for t in args.targets.split(","):
    got = start(t, work, backend, args); targets[t] = got
for f in [x for x in args.floors.split(",") if x]:
    port = free_port()
    targets["floor_" + f] = (Proc("floor_" + f, [sys.executable, str(Path(__file__).parent / "floor_server.py"), f, str(port), backend], work), f"http://127.0.0.1:{port}")
rows = []
try:
    for t, (p, url) in targets.items():
        wait_ready(p, url)
    for cell, (t, (p, url)) in enumerate(targets.items()):
        w = T.Workload(f"c{cell}", args, cell)
        groups = {"proxy": p, "backend": procs[0]}
        def cpu():
            return {**{k: group_cpu_s(q.proc.pid) for k, q in groups.items() if q}, "client": sum(os.times()[:2])}
        row = asyncio.run(T.drive(f"{url}/v1/chat/completions", t if not t.startswith("floor") else "direct", w, "all_miss", args, int(args.concurrency), cpu))
        row["target"] = t
        rows.append(row)
        print(f"{t:16s} {row['rps']:7.1f} req/s  cpu/req proxy {row.get('proxy_cpu_ms_per_req')}  backend {row['backend_cpu_ms_per_req']}  client {row['client_cpu_ms_per_req']}  err {row['errors']}", flush=True)
finally:
    for p in procs + [v[0] for v in targets.values()]:
        if p: p.stop()
if args.json:
    args.json.write_text(json.dumps(rows, indent=1))
