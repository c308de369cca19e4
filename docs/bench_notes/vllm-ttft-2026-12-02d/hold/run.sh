#!/bin/bash
cd /tmp/benchcwd
for i in 1 2; do
  for m in 0 1; do
    KVX_HOLD=$m PYTHONPATH=/tmp/snap-g KVGATE_VLLM_PYTHON=/work/main/.venv-vllm/bin/python timeout 1200 flock /tmp/kvgate-vllm.lock /work/main/.venv/bin/python -m kvgate.middleware.cli bench vllm --runs 4 --arms kvgate_precise,sglang --tune-conversations 0 --trace /work/shared/data/mooncake_conversation_trace.jsonl --json /work/b63/hold/h$m-$i.json > /work/b63/hold/h$m-$i.log 2>&1
  done
done
echo done > /work/b63/hold/done
