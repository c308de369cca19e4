#!/bin/bash
# the goal cell: the session's start (base, bc8fd78) and its end (new) alternated, the order swapped
# each round, sglang-router measured in every run
cd /tmp/benchcwd
for i in $(seq ${FIRST:-1} ${LAST:-12}); do
  if [ $((i % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for t in $order; do
    flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-$t /work/main/.venv/bin/python -m kvgate.middleware.cli bench throughput --targets kvgate_router,sglang_router --mixes all_miss --concurrency 32 --json /work/b57/tp/$t-$i.json > /work/b57/tp/$t-$i.log 2>&1
  done
done
