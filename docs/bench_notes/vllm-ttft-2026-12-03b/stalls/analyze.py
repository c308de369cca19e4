"""Stalls of kvgate's event-loop thread in sampler.py's timeline."""
import json, sys
from collections import Counter, defaultdict

IDLE = {"232", "281", "441"}  # epoll_wait, epoll_pwait, epoll_pwait2
rows = defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[r["pid"]].append(r)
MIN_MS = float(sys.argv[2]) if len(sys.argv) > 2 else 40
for pid, rs in rows.items():
    main = str(pid)
    gaps = [b["t"] - a["t"] for a, b in zip(rs, rs[1:])]
    gaps.sort()
    print(f"pid {pid}: {len(rs)} samples over {rs[-1]['t']-rs[0]['t']:.1f}s, interval p50 {gaps[len(gaps)//2]*1e3:.1f} p99 {gaps[int(len(gaps)*.99)]*1e3:.1f} max {gaps[-1]*1e3:.1f} ms")
    sc = Counter(r["th"].get(main, ["?", 0, 0, "?"])[3] for r in rs)
    print("  main syscalls:", sc.most_common(8))
    start = None
    stalls = []
    for i, r in enumerate(rs):
        m = r["th"].get(main)
        if m is None:
            continue
        busy = m[3] not in IDLE
        if busy and start is None:
            start = i
        elif not busy and start is not None:
            stalls.append((start, i))
            start = None
    for a, b in stalls:
        t0, t1 = rs[a - 1]["t"] if a else rs[a]["t"], rs[b]["t"]
        dur = (t1 - t0) * 1e3
        if dur < MIN_MS:
            continue
        A, B = rs[a - 1 if a else a], rs[b]
        m0, m1 = A["th"][main], B["th"][main]
        cpu = (m1[1] - m0[1]) / 1e6
        wait = (m1[2] - m0[2]) / 1e6
        states = Counter((r["th"][main][0], r["th"][main][3]) for r in rs[a:b])
        others = []
        for tid, v in B["th"].items():
            if tid == main or tid not in A["th"]:
                continue
            d = (v[1] - A["th"][tid][1]) / 1e6
            w = (v[2] - A["th"][tid][2]) / 1e6
            if d > 1 or w > 5:
                others.append((round(d, 1), round(w, 1), tid))
        others.sort(reverse=True)
        print(f"  stall at +{t0-rs[0]['t']:.2f}s {dur:.0f} ms: main cpu {cpu:.1f} wait {wait:.1f}; states {dict(states.most_common(5))}; others (cpu, wait, tid) {others[:5]}")
