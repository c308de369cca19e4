#!/bin/bash
# hit-heavy relay, the session's start (plain) and end (fin3) alternated twice; then approximate mode's five runs
cd /tmp/benchcwd
for i in 1 2; do for t in plain fin3; do
  flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/t_$t /work/main/.venv/bin/python -m kvgate.middleware.cli bench throughput --targets kvgate_relay --mixes hit_heavy --concurrency 32,128 --json /work/b54/hh/$t-$i.json > /work/b54/hh/$t-$i.log 2>&1
done; done
date -u > /work/b54/acc/started
flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/t_fin3 /work/main/.venv/bin/python -m kvgate.middleware.cli bench vllm --runs 5 --arms kvgate_approximate,sglang --tune-conversations 8 --anchor-grid 0.5/8/1.25 --trace /work/shared/data/mooncake_conversation_trace.jsonl --json /work/b54/acc/vllm.json > /work/b54/acc/vllm.log 2>&1
date -u > /work/b54/acc/ended
