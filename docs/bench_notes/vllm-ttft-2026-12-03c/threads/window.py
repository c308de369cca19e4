"""Per-thread CPU of each kvgate serve process over its serving window (from 20 s after its first
sample to 183 s: after start-up, before the arm ends), from cpusampler.py's timeline."""
import gzip, json, sys
here = sys.argv[1] if len(sys.argv) > 1 else "."
r = json.load(open(f"{here}/cpu.json"))
tl = json.load(gzip.open(f"{here}/cpu.json.timeline.gz"))
for pid in r:
    keys = [f"{pid}/{t}" for t in r[pid]]
    rows = [(t, s) for t, s in tl if f"{pid}/{pid}" in s]
    t0 = rows[0][0]
    a = next(s for t, s in rows if t - t0 > 20)
    b = next(s for t, s in rows if t - t0 > 183)
    print(f"process {pid}: 163 s window, 64 requests")
    for k in keys:
        d = b.get(k, 0) - a.get(k, 0)
        if d > 0.005:
            print(f"   {r[pid][k.split('/')[1]]['name']:<24} {d:6.2f} s  {d / 64 * 1000:6.2f} ms per request")
