#!/bin/bash
# cf99b44 (the same code as ../tick): both modes and sglang-router, two more runs, --wire, the same
# options as ../head
cd /tmp/benchcwd
export KVGATE_VLLM_PYTHON=/work/main/.venv-vllm/bin/python
D=/tmp/b41/final
flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-41b /work/main/.venv/bin/python -m kvgate.middleware.cli bench vllm --runs 2 --arms kvgate_precise,kvgate_approximate,sglang --wire --tune-conversations 8 --anchor-grid 0.5/8/1.25 --trace /work/shared/data/mooncake_conversation_trace.jsonl --json $D/vllm.json > $D/run.log 2>&1
