#!/bin/bash
# old (one timer armed and cancelled per wait) against new (one timer per connection, moved when it fires),
# alternated; sglang-router beside the new tree in each round. Chunks 10 ms apart.
cd /tmp/benchcwd
OUT=${OUT:-$PWD}
cell() { # tree targets q round
  PYTHONPATH=$1 flock /tmp/kvgate-vllm.lock /work/main/.venv/bin/python -m kvgate.middleware.cli bench throughput \
    --targets $2 --mixes all_miss --concurrency 32 --stream-share 1.0 --question-words $3 --chunk-gap-ms 10 \
    --requests 3000 --duration-s 20 --warmup 64 --json $OUT/$5-q$3-$4.json > $OUT/$5-q$3-$4.log 2>&1
}
for r in 1 2 3; do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for t in $order; do
    if [ $t = old ]; then tree=OLD_SNAPSHOT; targets=kvgate_router; else tree=NEW_SNAPSHOT; targets=kvgate_router,sglang_router; fi
    for q in 16 136; do cell $tree $targets $q $r $t; done
  done
done
