#!/bin/bash
cd /tmp/benchcwd
PY=/work/main/.venv/bin/python
D=/work/b62/yield; mkdir -p $D
for i in 1 2; do
  if [ $i = 1 ]; then order="h y"; else order="y h"; fi
  for t in $order; do
    flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-$t KVG_FEEDBACK=off $PY -m kvgate.middleware.cli bench throughput --seed 1 --targets kvgate_relay --mixes hit_heavy --concurrency 32,128 --requests 12000 --duration-s 30 --json $D/$t-$i.json > $D/$t-$i.log 2>&1
  done
done
