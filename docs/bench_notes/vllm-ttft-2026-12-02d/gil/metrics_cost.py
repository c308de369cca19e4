"""CPU of a vLLM API server per GET /metrics: the whole page against only the samples kvgate reads
(Prometheus's name[] query parameters). One server, after a few chat requests so its histograms
have samples; rounds alternated."""
import json, os, sys, time, urllib.parse, urllib.request
from pathlib import Path
import psutil
from kvgate.engines.vllm.launch import VllmServer, default_model_dir
from kvgate.middleware.telemetry.replica_scrape import SCRAPED, parse_metrics

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100
srv = VllmServer(str(default_model_dir()), core=0, log_path=Path("/work/b63/vllm-metrics.log")).start()
try:
    srv.wait_ready(300)
    root = srv.api_base.rsplit("/v1", 1)[0]
    for i in range(4):
        body = json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": f"hello {i} " * 200}], "max_tokens": 8}).encode()
        urllib.request.urlopen(urllib.request.Request(srv.api_base + "/chat/completions", body, {"content-type": "application/json"}), timeout=120).read()
    procs = [psutil.Process(srv.proc.pid)] + psutil.Process(srv.proc.pid).children(recursive=True)
    print("processes", [(p.pid, p.name(), " ".join(p.cmdline()[:3])[:80]) for p in procs])
    full = root + "/metrics"
    restricted = full + "?" + urllib.parse.urlencode([("name[]", n) for n in sorted(SCRAPED)])
    def cpu():
        return [sum(p.cpu_times()[:2]) for p in procs]
    for url, label in ((full, "full"), (restricted, "restricted")):
        text = urllib.request.urlopen(url).read().decode()
        s = parse_metrics(text, SCRAPED)
        print(label, "bytes", len(text), "lines", text.count("\n"), "samples read", len(s))
    res = {"full": [], "restricted": []}
    for rnd in range(3):
        for url, label in ((full, "full"), (restricted, "restricted")):
            before, t0 = cpu(), time.perf_counter()
            for _ in range(N):
                urllib.request.urlopen(url).read()
            wall, after = time.perf_counter() - t0, cpu()
            per = [(a - b) / N * 1000 for a, b in zip(after, before)]
            res[label].append(per[0])
            print(f"round {rnd} {label}: API server {per[0]:.2f} ms CPU per read (others {[round(x,2) for x in per[1:]]}), wall {wall / N * 1000:.2f} ms per read")
    print("summary", {k: [round(x, 2) for x in v] for k, v in res.items()})
    full_s = parse_metrics(urllib.request.urlopen(full).read().decode(), SCRAPED)
    rest_s = parse_metrics(urllib.request.urlopen(restricted).read().decode(), SCRAPED)
    print("same sample keys:", set(full_s) == set(rest_s), len(full_s), len(rest_s))
finally:
    srv.stop()
