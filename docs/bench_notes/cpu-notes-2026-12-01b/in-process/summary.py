"""pipeline_cpu --requests 6000 (router target, in process), base bc8fd78 against new, order swapped each round."""

import json
import math
import statistics as st

logs = []
for i in range(1, 7):
    b, n = (json.load(open(f"{t}-{i}.json")) for t in ("base", "new"))
    r = n["cpu_ms_per_request"] / b["cpu_ms_per_request"]
    logs.append(math.log(r))
    print(f"round {i}: base {b['cpu_ms_per_request']:.4f}  new {n['cpu_ms_per_request']:.4f} ms CPU per request  ratio {r:.3f}  errors {b['errors']}/{n['errors']}")
m, s = st.mean(logs), st.stdev(logs)
h = 2.571 * s / math.sqrt(len(logs))
print(f"new/base geometric {math.exp(m):.3f} (95% {math.exp(m - h):.3f}-{math.exp(m + h):.3f})")
