#!/bin/bash
# the settle change (a prompt waits only for queued records that start as it does) against the tree
# before it, alternated: A = dbc2a48 (/tmp/snap-37), B = the change (/tmp/snap-38), kvgate
# approximate and sglang-router, two runs per set, the wire capture on
cd /tmp/benchcwd
export KVGATE_VLLM_PYTHON=/work/main/.venv-vllm/bin/python
D=/work/main/docs/bench_notes/vllm-ttft-2026-12-03/settle
for set in A1 B1 A2 B2; do
  case $set in A*) T=/tmp/snap-37;; B*) T=/tmp/snap-38;; esac
  flock /tmp/kvgate-vllm.lock env PYTHONPATH=$T /work/main/.venv/bin/python -m kvgate.middleware.cli bench vllm --runs 2 --arms kvgate_approximate,sglang --wire --tune-conversations 8 --anchor-grid 0.5/8/1.25 --trace /work/shared/data/mooncake_conversation_trace.jsonl --json $D/$set.json > $D/$set.log 2>&1
done
