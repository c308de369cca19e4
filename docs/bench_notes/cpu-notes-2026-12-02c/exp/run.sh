#!/bin/bash
# prototypes (not the product): what the request log and the entry write cost the relay's all-miss cell
cd /tmp/benchcwd
PY=/work/main/.venv/bin/python
for i in 1 2 3; do
  for m in base norec merged merged_t nostore; do
    flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-exp KVX=$m $PY -m kvgate.middleware.cli bench throughput --targets kvgate_relay --mixes all_miss --concurrency 32 --json /work/b62/exp/$m-$i.json > /work/b62/exp/$m-$i.log 2>&1
  done
  flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-exp $PY -m kvgate.middleware.cli bench throughput --targets sglang_router --mixes all_miss --concurrency 32 --json /work/b62/exp/sglang-$i.json > /work/b62/exp/sglang-$i.log 2>&1
done
echo done > /work/b62/exp/done
