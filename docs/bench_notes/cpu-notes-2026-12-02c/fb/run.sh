#!/bin/bash
# the relay with feedback on (the default) and off (feedback-off.diff), alternated, on the tree
# with `feedback.enabled`; sglang-router in each all-miss round
cd /tmp/benchcwd
PY=/work/main/.venv/bin/python
D=/work/main/docs/bench_notes/cpu-notes-2026-12-02c/fb
ord() { if [ $(($1 % 2)) = 1 ]; then echo "on off"; else echo "off on"; fi; }
for i in 1 2 3; do
  for f in $(ord $i); do
    flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-new KVG_FEEDBACK=$f $PY -m kvgate.middleware.cli bench throughput --targets kvgate_relay --mixes all_miss,hit_heavy --concurrency 32,128 --requests 12000 --duration-s 30 --json $D/$f-$i.json > $D/$f-$i.log 2>&1
  done
  flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-new $PY -m kvgate.middleware.cli bench throughput --targets sglang_router --mixes all_miss --concurrency 32 --requests 12000 --duration-s 30 --json $D/sglang-$i.json > $D/sglang-$i.log 2>&1
done
echo done > $D/done
