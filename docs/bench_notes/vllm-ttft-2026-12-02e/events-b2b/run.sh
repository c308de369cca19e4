#!/bin/bash
# per-event CPU: the same all-miss streamed requests with 16 and 256 words in each answer
cd /tmp/benchcwd
for r in 1 2; do
for q in 16 256; do
PYTHONPATH=SNAPSHOT flock /tmp/kvgate-vllm.lock /work/main/.venv/bin/python -m kvgate.middleware.cli bench throughput \
  --targets kvgate_router,sglang_router --mixes all_miss --concurrency 32 --stream-share 1.0 \
  --question-words $q --requests 3000 --duration-s 15 --json $OUT/q$q-$r.json > $OUT/q$q-$r.log 2>&1
done; done
