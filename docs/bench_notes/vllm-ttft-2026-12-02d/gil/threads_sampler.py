"""Sample every thread of the kvgate serve process: voluntary/involuntary switches and schedstat
(run ns, wait ns, slices), every 0.5 s, as JSON lines, until the process is gone."""
import json, os, sys, time
out = open(sys.argv[1], "w")
def find():
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try: cmd = open(f"/proc/{pid}/cmdline","rb").read().replace(b"\0", b" ").decode()
        except OSError: continue
        if "kvgate" in cmd and " serve" in cmd and "sliced" not in cmd and "bench" not in cmd:
            return int(pid), cmd
    return None, None
seen = set()
while True:
    pid, cmd = find()
    if pid is None:
        time.sleep(0.2); continue
    if pid not in seen:
        seen.add(pid); out.write(json.dumps({"pid": pid, "cmd": cmd[:200]}) + "\n")
    while os.path.exists(f"/proc/{pid}"):
        rows = {}
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    st = open(f"/proc/{pid}/task/{tid}/status").read()
                    comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
                    ss = open(f"/proc/{pid}/task/{tid}/schedstat").read().split()
                except OSError: continue
                d = dict(l.split(":\t") for l in st.strip().split("\n") if ":\t" in l)
                rows[tid] = [comm, int(d["voluntary_ctxt_switches"]), int(d["nonvoluntary_ctxt_switches"]), int(ss[0]), int(ss[1]), int(ss[2])]
        except OSError: break
        out.write(json.dumps({"t": time.time(), "pid": pid, "th": rows}) + "\n"); out.flush()
        time.sleep(0.5)
