import sys, re, collections
inc_file = collections.Counter(); inc_fn = collections.Counter(); self_fn = collections.Counter(); total = 0
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" ")
    n = int(n)
    frames = stack.split(";")
    if not any("pipeline_cpu.py" in f for f in frames) and "thread" not in stack.lower():
        pass
    # keep only samples after imports: skip import frames
    if any("_find_and_load" in f for f in frames):
        continue
    total += n
    seen_f, seen_fn = set(), set()
    for f in frames:
        m = re.match(r"(.*) \((.*):(\d+)\)", f)
        if not m: continue
        fn, path = m.group(1), m.group(2)
        key = path
        if key not in seen_f: inc_file[key] += n; seen_f.add(key)
        k2 = f"{fn} ({path})"
        if k2 not in seen_fn: inc_fn[k2] += n; seen_fn.add(k2)
    m = re.match(r"(.*) \((.*):(\d+)\)", frames[-1])
    if m: self_fn[f"{m.group(1)} ({m.group(2)})"] += n
print("total", total)
print("== inclusive by file"); [print(f"{100*c/total:5.1f}% {k}") for k, c in inc_file.most_common(int(sys.argv[2]) if len(sys.argv)>2 else 50)]
print("== inclusive by function"); [print(f"{100*c/total:5.1f}% {k}") for k, c in inc_fn.most_common(80)]
print("== self"); [print(f"{100*c/total:5.1f}% {k}") for k, c in self_fn.most_common(40)]
