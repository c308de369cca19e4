# measuring device only: logs every garbage collection of generation 1 and 2, and any collection over 2 ms
import gc, os, sys, time
_path = os.environ.get("KVX_GCLOG")
if _path and "serve" in " ".join(sys.argv):
    _t = {}
    def _cb(phase, info):
        if phase == "start":
            _t["s"] = time.perf_counter(); _t["c"] = time.thread_time()
        else:
            d = time.perf_counter() - _t.get("s", time.perf_counter())
            c = time.thread_time() - _t.get("c", time.thread_time())
            if info["generation"] >= 1 or d > 0.002:
                with open(_path, "a") as f:
                    f.write(f"{os.getpid()} {time.time():.3f} gen{info['generation']} wall_ms {d*1000:.2f} cpu_ms {c*1000:.2f} collected {info['collected']}\n")
    gc.callbacks.append(_cb)
