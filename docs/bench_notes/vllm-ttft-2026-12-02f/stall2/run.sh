#!/bin/bash
# a second set: the stall charge in both modes against the default and sglang-router,
# 64 conversations per run, four runs
cd /tmp/benchcwd
export KVGATE_VLLM_PYTHON=/work/main/.venv-vllm/bin/python
D=/work/main/docs/bench_notes/vllm-ttft-2026-12-02f/stall2
flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-35b /work/main/.venv/bin/python -m kvgate.middleware.cli bench vllm --runs 4 --conversations 64 --arms kvgate_precise,kvgate_precise_stall,kvgate_approximate_stall,sglang --tune-conversations 8 --anchor-grid 0.5/8/1.25 --trace /work/shared/data/mooncake_conversation_trace.jsonl --json $D/vllm.json > $D/run.log 2>&1
