#!/bin/bash
# hit-heavy relay (the exact tier on): the session's start (base) against the answer notes (new), alternated
cd /tmp/benchcwd
for i in 1 2; do
  if [ $((i % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for t in $order; do
    flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-$t /work/main/.venv/bin/python -m kvgate.middleware.cli bench throughput --targets kvgate_relay --mixes hit_heavy --concurrency 32,128 --json /work/b56/hh/$t-$i.json > /work/b56/hh/$t-$i.log 2>&1
  done
done
