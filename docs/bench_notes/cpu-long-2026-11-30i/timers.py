"""Wrap named functions to accumulate thread CPU (time.thread_time) per call; report per request."""
import time, functools, importlib, threading, collections, inspect
acc = collections.Counter(); calls = collections.Counter()
_depth = threading.local()
def wrap(modname, qual):
    mod = importlib.import_module(modname)
    owner = mod; parts = qual.split('.')
    for p in parts[:-1]: owner = getattr(owner, p)
    fn = getattr(owner, parts[-1])
    key = modname.split('.')[-1] + ':' + qual
    if inspect.iscoroutinefunction(fn):
        return  # skip
    @functools.wraps(fn)
    def w(*a, **k):
        t = time.thread_time()
        try: return fn(*a, **k)
        finally: acc[key] += time.thread_time() - t; calls[key] += 1
    setattr(owner, parts[-1], w)
def report(n):
    for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"{v/n*1e3:8.3f} ms/req  {calls[k]/n:5.2f} calls/req  {k}")
