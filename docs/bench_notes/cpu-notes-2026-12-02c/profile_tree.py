import sys, re, collections
root = sys.argv[2]; depth = int(sys.argv[3]) if len(sys.argv) > 3 else 4; minp = float(sys.argv[4]) if len(sys.argv) > 4 else 0.3
total = 0; tree = {}
def node(): return [0, {}]
top = node()
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(' '); n = int(n); total += n
    fr = [re.sub(r':\d+\)', ')', f) for f in stack.split(';')]
    idx = next((i for i, f in enumerate(fr) if root in f), None)
    if idx is None: continue
    cur = top; cur[0] += n
    for f in fr[idx: idx + depth]:
        cur = cur[1].setdefault(f, node()); cur[0] += n
def show(nd, ind):
    for k, v in sorted(nd[1].items(), key=lambda kv: -kv[1][0]):
        if 100 * v[0] / total < minp: continue
        print(f"{' '*ind}{100*v[0]/total:5.1f}% {k[:110]}")
        show(v, ind + 2)
print("total", total, "under", root, f"{100*top[0]/total:.1f}%")
show(top, 0)
