#!/bin/bash
# the goal cell again: the session's start (plain) and its final code (fin3) alternated, sglang-router in every run
cd /tmp/benchcwd
for i in 1 2 3; do for t in fin3 plain; do
  flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/t_$t /work/main/.venv/bin/python -m kvgate.middleware.cli bench throughput --targets kvgate_router,sglang_router --mixes all_miss --concurrency 32 --json /work/b54/tp3/$t-$i.json > /work/b54/tp3/$t-$i.log 2>&1
done; done
