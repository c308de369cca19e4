#!/bin/bash
# the goal cell: the session's start (base, af9d152) and the answer notes (new, f4324dc) alternated,
# the order swapped each round, sglang-router in every run
cd /tmp/benchcwd
for i in 1 2 3 4; do
  if [ $((i % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for t in $order; do
    flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-$t /work/main/.venv/bin/python -m kvgate.middleware.cli bench throughput --targets kvgate_router,sglang_router --mixes all_miss --concurrency 32 --json /work/b56/tp/$t-$i.json > /work/b56/tp/$t-$i.log 2>&1
  done
done
