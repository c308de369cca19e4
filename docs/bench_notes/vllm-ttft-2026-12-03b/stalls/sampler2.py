"""Watch kvgate serve's main thread; when it has been runnable (R) without running for >40 ms,
snapshot every R thread on the machine: pid, tid, comm, cpu, prio, nice, policy, run/wait ns."""
import os, sys, time, json, signal
STOP = []
signal.signal(signal.SIGTERM, lambda *a: STOP.append(1))

def find():
    out = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                argv = open(f"/proc/{e}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if any(b"kvgate" in a for a in argv) and b"serve" in argv and b"bench" not in argv:
                out.append(int(e))
    return out

def snapshot():
    rows = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tids:
            try:
                st = open(f"/proc/{p}/task/{t}/stat").read()
                ss = open(f"/proc/{p}/task/{t}/schedstat").read().split()
            except OSError:
                continue
            rp = st.rfind(")")
            f = st[rp + 2:].split()
            if f[0] in "RD":
                rows.append([int(p), int(t), st[st.find("(")+1:rp], f[0], int(f[36]), int(f[15]), int(f[16]), int(f[38]), int(ss[0]), int(ss[1])])
    return rows

out = open(sys.argv[1], "w")
end = time.time() + float(sys.argv[2])
pids, rescan = [], 0.0
since = {}
steal0 = None
while time.time() < end and not STOP:
    now = time.time()
    if now > rescan:
        pids, rescan = find(), now + 1.0
    for pid in pids:
        try:
            st = open(f"/proc/{pid}/task/{pid}/stat").read()
            ss = open(f"/proc/{pid}/task/{pid}/schedstat").read().split()
        except OSError:
            continue
        state = st[st.rfind(")") + 2]
        run, wait = int(ss[0]), int(ss[1])
        prev = since.get(pid)
        if state == "R" and prev is not None and run == prev[1]:
            if time.monotonic() - prev[0] > 0.04 and not prev[2]:
                cpu = open("/proc/stat").readline()
                out.write(json.dumps({"t": time.monotonic(), "pid": pid, "stuck_ms": (time.monotonic()-prev[0])*1e3, "main_cpu": int(st[st.rfind(')')+2:].split()[36]), "stat": cpu, "R": snapshot()}) + "\n")
                out.flush()
                since[pid] = (prev[0], run, True)
        else:
            since[pid] = (time.monotonic(), run, False)
    time.sleep(0.003)
out.close()
