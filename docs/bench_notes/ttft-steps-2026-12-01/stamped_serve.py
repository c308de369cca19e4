"""kvgate serve in this process with timestamps at each step of a request (requests one at a
time: stamps attach to the latest begun); writes per-step medians/p99 to argv[3] at exit."""
import sys, time, json, atexit, signal, statistics
cfg_path, port, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
from kvgate.middleware.config import load_config
from kvgate.middleware.server.proxy import create_app
from kvgate.middleware.server import quiet_server, one_write, chat_asgi
from kvgate.middleware import pipeline as pl
from kvgate.middleware.forward import http1
from kvgate.middleware.litellm_env import litellm
litellm.disable_streaming_logging = True
T = time.perf_counter
reqs = []
cur = [None]
def stamp(name):
    if cur[0] is not None and name not in cur[0]: cur[0][name] = T()
P = one_write.OneWriteHttp
orig_dr = P.data_received
def data_received(self, data):
    if data[:5] == b"POST ":
        cur[0] = {"recv": T()}; reqs.append(cur[0])
    else: stamp("recv2")
    return orig_dr(self, data)
P.data_received = data_received
orig_omc = P.on_message_complete
def omc(self, *a):
    stamp("parsed"); return orig_omc(self, *a)
P.on_message_complete = omc
orig_serve = chat_asgi.ChatHandler._serve
async def _serve(self, scope, receive, send):
    stamp("handler"); return await orig_serve(self, scope, receive, send)
chat_asgi.ChatHandler._serve = _serve
orig_ac = pl.Pipeline.acomplete
async def acomplete(self, *a, **k):
    stamp("pipeline"); r = await orig_ac(self, *a, **k); stamp("pipeline_ret")
    if r.info.timing and len(r.info.timing) == 3: cur[0]["sent"], cur[0]["first"] = r.info.timing[1], r.info.timing[2]
    return r
pl.Pipeline.acomplete = acomplete
orig_resp = chat_asgi.ChatHandler.respond
async def respond(self, *a, **k):
    stamp("respond"); return await orig_resp(self, *a, **k)
chat_asgi.ChatHandler.respond = respond
H = one_write.HeadHeldTransport
orig_w = H.write
def write(self, data):
    r = orig_w(self, data); stamp("write1"); return r
H.write = write
import importlib, functools
EXTRA = [a for a in sys.argv[4:]]
def wrap_sync(spec):
    mod, attr = spec.split(":"); m = importlib.import_module(mod); obj = m; parts = attr.split(".")
    for p in parts[:-1]: obj = getattr(obj, p)
    f = getattr(obj, parts[-1]); short = parts[-1]
    if asyncio.iscoroutinefunction(f):
        async def w(*a, **k):
            stamp(short + "<"); r = await f(*a, **k); stamp(short + ">"); return r
    else:
        def w(*a, **k):
            stamp(short + "<"); r = f(*a, **k); stamp(short + ">"); return r
    setattr(obj, parts[-1], w)
    if len(parts) == 1:
        for other in list(sys.modules.values()):
            if other is not None and getattr(other, parts[0], None) is f: setattr(other, parts[0], w)
import asyncio
for spec in EXTRA: wrap_sync(spec)
def dump():
    order = ["recv", "recv2", "parsed", "handler", "pipeline", "sent", "first", "pipeline_ret", "respond", "write1"]
    rows = {}
    allk = {k for r in reqs[20:] for k in r}
    import statistics as st
    have = sorted(allk, key=lambda k: st.median([r[k] for r in reqs[20:] if k in r] ) - st.median([r["recv"] for r in reqs[20:] if k in r]))
    rows["n_recv"] = sum("recv" in r for r in reqs)
    for a, b in zip(have, have[1:]):
        xs = [(r[b] - r[a]) * 1e3 for r in reqs[20:] if a in r and b in r]
        if xs:
            xs.sort(); rows[f"{a}->{b}"] = (len(xs), round(statistics.median(xs), 3), round(xs[int(.9 * len(xs))], 3), round(xs[int(.99 * len(xs))], 3))
    json.dump(rows, open(out_path, "w"), indent=1)
atexit.register(dump)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
quiet_server.serve(create_app(load_config(cfg_path), server_process=True), host="127.0.0.1", port=port, log_level="warning", access_log=False, timeout_keep_alive=75)
