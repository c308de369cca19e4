#!/bin/bash
# the command on 7fad179, on an AVX2-only AMD EPYC host (no AVX-512): both modes and sglang-router, five runs, --wire
cd /tmp/benchcwd
export KVGATE_VLLM_PYTHON=/work/main/.venv-vllm/bin/python
D=/work/main/docs/bench_notes/vllm-ttft-2026-12-03c/head
flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-41a /work/main/.venv/bin/python -m kvgate.middleware.cli bench vllm --runs 5 --arms kvgate_precise,kvgate_approximate,sglang --wire --tune-conversations 8 --anchor-grid 0.5/8/1.25 --trace /work/shared/data/mooncake_conversation_trace.jsonl --json $D/vllm.json > $D/run.log 2>&1
