#!/bin/bash
# the all-miss C=32 cell, three rounds, on a snapshot of the tree
cd /tmp/benchcwd
PY=/work/main/.venv/bin/python
D=${OUT:-$PWD}
for i in 1 2 3; do
  flock /tmp/kvgate-vllm.lock env PYTHONPATH=${SNAP:-SNAPSHOT} $PY -m kvgate.middleware.cli bench throughput --targets kvgate_relay,kvgate_router,sglang_router --mixes all_miss --concurrency 32 --requests 12000 --duration-s 30 --seed 1 --json $D/goal-$i.json > $D/goal-$i.log 2>&1
done
