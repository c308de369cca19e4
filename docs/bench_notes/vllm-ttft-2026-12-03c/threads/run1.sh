#!/bin/bash
cd /tmp/benchcwd
export KVGATE_VLLM_PYTHON=/work/main/.venv-vllm/bin/python
D=/tmp/b41/out
python3 /tmp/b41/cpusampler.py $D/cpu.json &
SP=$!
flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-41a:/tmp/b41/site /work/main/.venv/bin/python -m kvgate.middleware.cli bench vllm --runs 1 --arms kvgate_precise,kvgate_approximate --tune-conversations 0 --trace /work/shared/data/mooncake_conversation_trace.jsonl --json $D/vllm.json > $D/run.log 2>&1
kill $SP
wait
