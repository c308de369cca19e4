#!/bin/bash
# 7af9b96 (the tokenizer's ids without offsets): the command, both modes and sglang-router,
# --wire, the same options as ../../vllm-ttft-2026-12-03c/head
cd /tmp/benchcwd
export KVGATE_VLLM_PYTHON=/work/main/.venv-vllm/bin/python
D=/tmp/b41/set
flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-C /work/main/.venv/bin/python -m kvgate.middleware.cli bench vllm --runs 5 --arms kvgate_precise,kvgate_approximate,sglang --wire --tune-conversations 8 --anchor-grid 0.5/8/1.25 --trace /work/shared/data/mooncake_conversation_trace.jsonl --json $D/vllm.json > $D/run.log 2>&1
