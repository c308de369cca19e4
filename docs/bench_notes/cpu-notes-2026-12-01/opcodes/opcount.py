"""Opcodes executed per request, by function: a deterministic measure of the Python work."""

import sys, collections, json, argparse
from kvgate.tools.bench import pipeline_cpu as pc


class Counter:
    def __init__(self):
        self.ops = collections.Counter()

    def _local(self, frame, event, arg):
        if event == "opcode":
            self.ops[frame.f_code] += 1
        return self._local

    def _global(self, frame, event, arg):
        frame.f_trace_opcodes = True
        return self._local

    def enable(self):
        sys.settrace(self._global)

    def disable(self):
        sys.settrace(None)

    def dump_stats(self, path):
        rows = [
            (
                n,
                f"{c.co_filename.split('site-packages/')[-1].replace('/work/main/', '').replace('/tmp/', '')}:{c.co_firstlineno} {c.co_qualname}",
            )
            for c, n in self.ops.items()
        ]
        rows.sort(reverse=True)
        json.dump(rows, open(path, "w"))


pc.cProfile.Profile = Counter
parser = argparse.ArgumentParser()
pc.add_arguments(parser)
args = parser.parse_args()
r = pc.run(args)
rows = json.load(open(args.profile))
total = sum(n for n, _ in rows)
print("requests", args.requests, "opcodes/request", round(total / args.requests))
byfile = collections.Counter()
for n, k in rows:
    byfile[k.split(":")[0]] += n
for k, n in byfile.most_common(40):
    print(f"{n / args.requests:8.0f} {k}")
print("--- functions")
for n, k in rows[:60]:
    print(f"{n / args.requests:8.1f} {k}")
