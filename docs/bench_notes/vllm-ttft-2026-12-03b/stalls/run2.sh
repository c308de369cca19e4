#!/bin/bash
cd /tmp/benchcwd
export KVGATE_VLLM_PYTHON=/work/main/.venv-vllm/bin/python
D=/tmp/b40
python3 /tmp/b40/sampler2.py $D/stuck.jsonl 900 &
SP=$!
flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-40 /work/main/.venv/bin/python -m kvgate.middleware.cli bench vllm --runs 1 --arms kvgate_precise,kvgate_approximate --tune-conversations 0 --trace /work/shared/data/mooncake_conversation_trace.jsonl --json $D/vllm2.json > $D/run2.log 2>&1
kill $SP
