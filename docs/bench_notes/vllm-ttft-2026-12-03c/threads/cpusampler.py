"""Per-thread CPU of kvgate serve processes: snapshot every 0.5 s; at the end, per process, per
thread: CPU seconds between the first and last snapshot, with names."""
import os, sys, time, json, signal
STOP = []
signal.signal(signal.SIGTERM, lambda *a: STOP.append(1))
TICK = os.sysconf("SC_CLK_TCK")
def find():
    out = []
    for e in os.listdir("/proc"):
        if not e.isdigit(): continue
        try: argv = open(f"/proc/{e}/cmdline", "rb").read().split(b"\0")
        except OSError: continue
        if any(b"kvgate" in a for a in argv) and b"serve" in argv and b"bench" not in argv:
            out.append(int(e))
    return out
first, last = {}, {}
timeline = []
out = sys.argv[1]
while not STOP:
    for pid in find():
        try: tids = os.listdir(f"/proc/{pid}/task")
        except OSError: continue
        for tid in tids:
            try: st = open(f"/proc/{pid}/task/{tid}/stat").read()
            except OSError: continue
            f = st[st.rindex(")") + 2:].split()
            cpu = (int(f[11]) + int(f[12])) / TICK
            key = f"{pid}/{tid}"
            first.setdefault(key, (time.time(), cpu)); last[key] = (time.time(), cpu)
    timeline.append((time.time(), {k: v[1] for k, v in last.items()}))
    time.sleep(0.5)
res = {}
for key in last:
    pid, tid = key.split("/")
    try: names = json.load(open(f"/tmp/b41/out/threads-{pid}.json"))
    except Exception: names = {}
    res.setdefault(pid, {})[tid] = {"name": names.get(tid, "?"), "cpu_s": last[key][1] - first[key][1], "span_s": last[key][0]-first[key][0]}
json.dump(res, open(out, "w"), indent=1)
json.dump(timeline, open(out + ".timeline", "w"))
