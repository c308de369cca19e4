#!/bin/bash
# cache_aware's stall charge (stall_weight 1) against the default (0) and sglang-router,
# 64 conversations per run, five runs
cd /tmp/benchcwd
export KVGATE_VLLM_PYTHON=/work/main/.venv-vllm/bin/python
D=/work/main/docs/bench_notes/vllm-ttft-2026-12-02f/stall
flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-35b /work/main/.venv/bin/python -m kvgate.middleware.cli bench vllm --runs 5 --conversations 64 --arms kvgate_precise,kvgate_precise_stall,sglang --tune-conversations 8 --anchor-grid 0.5/8/1.25 --trace /work/shared/data/mooncake_conversation_trace.jsonl --json $D/vllm.json > $D/run.log 2>&1
