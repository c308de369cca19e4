"""Per kvgate process in sampler.py's timeline: the event loop's stretches away from epoll of
40 ms or more, kept only when sampled at least 5 times (a gap in the sampler's own samples is
not a stall), split by what the loop thread was doing: runnable without a core (its schedstat
wait grew by most of the stretch), blocked in futex (the GIL or a lock), or running."""
import json
import sys
from collections import defaultdict

IDLE = {"232", "281", "441"}
rows = defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[r["pid"]].append(r)
for n, (pid, rs) in enumerate(rows.items()):
    main = str(pid)
    out, start = [], None
    for i, r in enumerate(rs):
        m = r["th"].get(main)
        if m is None:
            continue
        if m[3] not in IDLE and start is None:
            start = i
        elif m[3] in IDLE and start is not None:
            out.append((start, i))
            start = None
    kinds = defaultdict(list)
    for a, b in out:
        if a == 0 or b - a < 5:
            continue
        A, B = rs[a - 1], rs[b]
        dur = (B["t"] - A["t"]) * 1e3
        if dur < 40:
            continue
        m0, m1 = A["th"][main], B["th"][main]
        wait, cpu = (m1[2] - m0[2]) / 1e6, (m1[1] - m0[1]) / 1e6
        futex = sum(r["th"][main][3] == "202" for r in rs[a:b]) / (b - a)
        kind = "futex" if futex > 0.5 else "no core" if wait > 0.8 * dur else "running" if cpu > 0.5 * dur else "mixed"
        kinds[kind].append(dur)
    span = rs[-1]["t"] - rs[0]["t"]
    print(f"process {n + 1} ({span:.0f} s sampled, start-up stretch excluded):")
    for kind, ds in sorted(kinds.items()):
        print(f"  {kind:8s} {len(ds):3d} stretches, {sum(ds):7.0f} ms in all, longest {max(ds):5.0f} ms")
