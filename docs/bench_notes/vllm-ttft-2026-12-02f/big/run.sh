#!/bin/bash
# four times the conversations per run (64 x 4 turns = 256 requests), both modes and sglang-router, five runs
cd /tmp/benchcwd
export KVGATE_VLLM_PYTHON=/work/main/.venv-vllm/bin/python
D=/work/b66/big
flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-34 /work/main/.venv/bin/python -m kvgate.middleware.cli bench vllm --runs 5 --conversations 64 --arms kvgate_precise,kvgate_approximate,sglang --tune-conversations 8 --anchor-grid 0.5/8/1.25 --trace /work/shared/data/mooncake_conversation_trace.jsonl --json $D/vllm.json > $D/run.log 2>&1
