#!/bin/bash
# start (88512e4) against the final tree: long prompts in process, hit-heavy relay, router overhead; then two vLLM sets on it
cd /tmp/benchcwd
PY=/work/main/.venv/bin/python
D=/work/b61/ab2
run() { flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-$1 $PY "${@:2}"; }
ord() { if [ $(($1 % 2)) = 1 ]; then echo "head new"; else echo "new head"; fi; }
for i in 1 2 3 4; do
  for t in $(ord $i); do
    run $t -m kvgate.tools.bench.pipeline_cpu --target relay --system-words 4000 --requests 2000 --json $D/ipl/$t-$i.json > $D/ipl/$t-$i.log 2>&1
  done
done
for i in 1 2; do
  for t in $(ord $i); do
    run $t -m kvgate.middleware.cli bench throughput --targets kvgate_relay --mixes hit_heavy --concurrency 32,128 --json $D/hh/$t-$i.json > $D/hh/$t-$i.log 2>&1
  done
done
for i in 1 2; do
  for t in $(ord $((i + 1))); do
    run $t -m kvgate.middleware.cli bench loop-load --rate 40 --duration-s 30 --prompt-words 4180 --conversations 20 --tokenizers text --shapes fresh,continue --json $D/ll/$t-$i.json > $D/ll/$t-$i.log 2>&1
  done
done
echo ab-done > $D/ab.done
for s in set1 set2; do
  mkdir -p /work/b61/vllm/$s
  KVGATE_VLLM_PYTHON=/work/main/.venv-vllm/bin/python run new -m kvgate.middleware.cli bench vllm --runs 5 --arms kvgate_precise,kvgate_approximate,sglang --tune-conversations 8 --anchor-grid 0.5/8/1.25 --trace /work/shared/data/mooncake_conversation_trace.jsonl --json /work/b61/vllm/$s/vllm.json > /work/b61/vllm/$s/run.log 2>&1
done
echo done > /work/b61/vllm/done
# then the matrix on the final tree (matrix/), three runs
for i in 1 2 3; do
  run new -m kvgate.middleware.cli bench throughput --targets kvgate_relay,kvgate_router,litellm_proxy,sglang_router --mixes all_miss,hit_heavy --concurrency 32,128 --json $D/matrix/run-$i.json > $D/matrix/run-$i.log 2>&1
done
# and two more rounds of router overhead (ll/, rounds 3 and 4)
for i in 3 4; do
  for t in $(ord $((i + 1))); do
    run $t -m kvgate.middleware.cli bench loop-load --rate 40 --duration-s 30 --prompt-words 4180 --conversations 20 --tokenizers text --shapes fresh,continue --json $D/ll/$t-$i.json > $D/ll/$t-$i.log 2>&1
  done
done
