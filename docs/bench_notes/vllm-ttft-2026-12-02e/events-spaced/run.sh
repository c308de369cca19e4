#!/bin/bash
# per-event CPU with the backend spacing each stream's chunks 10 ms apart (each its own read)
cd /tmp/benchcwd
SNAP=${SNAP:-SNAPSHOT}
for r in 1 2; do
for q in 16 136; do
PYTHONPATH=$SNAP flock /tmp/kvgate-vllm.lock /work/main/.venv/bin/python -m kvgate.middleware.cli bench throughput \
  --targets kvgate_router,sglang_router --mixes all_miss --concurrency 32 --stream-share 1.0 \
  --question-words $q --chunk-gap-ms 10 --requests 3000 --duration-s 20 --warmup 64 --json $OUT/q$q-$r.json > $OUT/q$q-$r.log 2>&1
done; done
