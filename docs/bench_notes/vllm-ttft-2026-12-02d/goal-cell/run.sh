#!/bin/bash
cd /tmp/benchcwd
PY=/work/main/.venv/bin/python
D=/work/b63/tp
for i in 1 2 3; do
  flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-f $PY -m kvgate.middleware.cli bench throughput --targets kvgate_relay,kvgate_router,sglang_router --mixes all_miss --concurrency 32 --requests 12000 --duration-s 30 --seed 1 --json $D/goal-$i.json > $D/goal-$i.log 2>&1
done
echo done > $D/done
