"""Per-thread timeline of kvgate serve processes: every ~3 ms, each task's state, syscall nr
(main thread) and schedstat. Output: JSON lines per sample for analysis."""
import os, sys, time, json, signal
STOP = []
signal.signal(signal.SIGTERM, lambda *a: STOP.append(1))

def find():
    out = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            argv = open(f"/proc/{e}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if any(b"kvgate" in a for a in argv) and b"serve" in argv and b"bench" not in argv:
            out.append(int(e))
    return out

def main(path, seconds):
    end = time.time() + seconds
    f = open(path, "w")
    pids, rescan = [], 0.0
    names = {}
    while time.time() < end and not STOP:
        now = time.time()
        if now > rescan:
            pids, rescan = find(), now + 1.0
        for pid in pids:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            row = {"t": time.monotonic(), "pid": pid, "th": {}}
            for tid in tids:
                try:
                    st = open(f"/proc/{pid}/task/{tid}/stat").read()
                    ss = open(f"/proc/{pid}/task/{tid}/schedstat").read().split()
                except OSError:
                    continue
                rp = st.rfind(")")
                state = st[rp + 2]
                key = (pid, tid)
                if key not in names:
                    names[key] = st[st.find("(") + 1 : rp]
                sc = ""
                if tid == str(pid):
                    try:
                        sc = open(f"/proc/{pid}/task/{tid}/syscall").read().split(" ", 1)[0]
                    except OSError:
                        pass
                row["th"][tid] = [state, int(ss[0]), int(ss[1]), sc]
            f.write(json.dumps(row) + "\n")
        time.sleep(0.003)
    f.close()
    json.dump({f"{p}/{t}": n for (p, t), n in names.items()}, open(path + ".names", "w"))

main(sys.argv[1], float(sys.argv[2]))
