#!/bin/bash
# the prototypes again with cells four times as long, and `bare` (nothing written at all)
cd /tmp/benchcwd
PY=/work/main/.venv/bin/python
D=/work/main/docs/bench_notes/cpu-notes-2026-12-02c/exp2
mkdir -p $D
for i in 1 2 3; do
  for m in base norec nostore bare; do
    flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-exp KVX=$m $PY -m kvgate.middleware.cli bench throughput --targets kvgate_relay --mixes all_miss --concurrency 32 --requests 12000 --duration-s 30 --json $D/$m-$i.json > $D/$m-$i.log 2>&1
  done
  flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-exp $PY -m kvgate.middleware.cli bench throughput --targets kvgate_router,sglang_router --mixes all_miss --concurrency 32 --requests 12000 --duration-s 30 --json $D/sglang-$i.json > $D/sglang-$i.log 2>&1
done
echo done > $D/done
