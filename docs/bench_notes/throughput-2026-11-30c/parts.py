import time, statistics, sys
from kvgate.middleware.config import parse_config
from kvgate.middleware.request import build_view, CacheControl
from kvgate.middleware.telemetry.metrics import Metrics
cfg = parse_config({"routes":[{"name":"r","model":"m*","backend":{"model":"openai/x","api_key":"k"},"semantic":{"enabled":False}}]})
sysw=" ".join(f"w{i}" for i in range(400))
kw={"model":"m1","messages":[{"role":"system","content":sysw},{"role":"user","content":"what is word 7 of them all please"}],"stream":True,"temperature":0.7,"max_tokens":64}
def med(fn,n=5000,r=9):
    xs=[]
    for _ in range(r):
        a=time.process_time()
        for _ in range(n): fn()
        xs.append((time.process_time()-a)/n*1e6)
    return statistics.median(xs)
m=Metrics()
def cl():
    m.lookups.labels("r","exact").inc(); m.lookup_latency.labels("r","exact").observe(0.001)
print(sys.argv[1], "build_view_us", round(med(lambda: build_view(cfg, kw, "t", CacheControl())),2), "lookup_metrics_us", round(med(cl),2))
