#!/bin/bash
# the command, both modes and both anchors, on a snapshot of the tree (f02e37d)
cd /tmp/benchcwd
export KVGATE_VLLM_PYTHON=/work/main/.venv-vllm/bin/python
D=/work/b66/modes
flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-34 /work/main/.venv/bin/python -m kvgate.middleware.cli bench vllm --runs 5 --arms kvgate_precise,kvgate_approximate,sglang,vllm_router --tune-conversations 8 --anchor-grid 0.5/8/1.25 --trace /work/shared/data/mooncake_conversation_trace.jsonl --json $D/vllm.json > $D/run.log 2>&1
