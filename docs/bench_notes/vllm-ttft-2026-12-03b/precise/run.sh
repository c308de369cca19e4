#!/bin/bash
# the command on fdea406 (both modes match a long new message on a lead of it), both modes and sglang-router, five runs, --wire
cd /tmp/benchcwd
export KVGATE_VLLM_PYTHON=/work/main/.venv-vllm/bin/python
D=/work/main/docs/bench_notes/vllm-ttft-2026-12-03b/precise
flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-42 /work/main/.venv/bin/python -m kvgate.middleware.cli bench vllm --runs 5 --arms kvgate_precise,kvgate_approximate,sglang --wire --tune-conversations 8 --anchor-grid 0.5/8/1.25 --trace /work/shared/data/mooncake_conversation_trace.jsonl --json $D/vllm.json > $D/run.log 2>&1
