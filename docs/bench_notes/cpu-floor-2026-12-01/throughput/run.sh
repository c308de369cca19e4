#!/bin/bash
# the goal cell: the session's start (plain) and its end (new) alternated, sglang-router in every run
cd /tmp/benchcwd
for i in 1 2 3; do for t in plain new; do
  flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/t_$t /work/main/.venv/bin/python -m kvgate.middleware.cli bench throughput --targets kvgate_router,sglang_router --mixes all_miss --concurrency 32 --json /work/b54/tp2/$t-$i.json > /work/b54/tp2/$t-$i.log 2>&1
done; done
for i in 1 2; do for t in plain new; do
  flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/t_$t /work/main/.venv/bin/python -m kvgate.tools.bench.pipeline_cpu --requests 6000 --json /work/b54/tp2/pc-$t-$i.json > /work/b54/tp2/pc-$t-$i.log 2>&1
done; done
