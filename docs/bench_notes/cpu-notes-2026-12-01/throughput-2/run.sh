#!/bin/bash
# the goal cell: the session's start (base, af9d152) and its end (new2, 59241b3) alternated,
# the order swapped each round, sglang-router in every run
cd /tmp/benchcwd
for i in 1 2 3 4 5 6 7 8; do
  if [ $((i % 2)) = 1 ]; then order="new2 base"; else order="base new2"; fi
  for t in $order; do
    flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-$t /work/main/.venv/bin/python -m kvgate.middleware.cli bench throughput --targets kvgate_router,sglang_router --mixes all_miss --concurrency 32 --json /work/b56/tp3/$t-$i.json > /work/b56/tp3/$t-$i.log 2>&1
  done
done
