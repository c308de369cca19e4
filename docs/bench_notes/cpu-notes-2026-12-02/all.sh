#!/bin/bash
# the session's measurements: start (3b69a66) against end, alternated with the order swapped each round
cd /tmp/benchcwd
PY=/work/main/.venv/bin/python
D=/work/b59/ab
run() { flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-$1 $PY "${@:2}"; }
ord() { if [ $(($1 % 2)) = 1 ]; then echo "start end"; else echo "end start"; fi; }
# in process: the relay target (exact tier on) and the router target
for i in 1 2 3 4; do
  for t in $(ord $i); do
    run $t -m kvgate.tools.bench.pipeline_cpu --target relay --requests 6000 --json $D/ipr/$t-$i.json > $D/ipr/$t-$i.log 2>&1
    run $t -m kvgate.tools.bench.pipeline_cpu --requests 6000 --json $D/ip/$t-$i.json > $D/ip/$t-$i.log 2>&1
  done
done
# the goal cell, both kvgate targets and sglang-router in every run
for i in $(seq 1 ${ROUNDS:-8}); do
  for t in $(ord $i); do
    run $t -m kvgate.middleware.cli bench throughput --targets kvgate_relay,kvgate_router,sglang_router --mixes all_miss --concurrency 32 --json $D/tp/$t-$i.json > $D/tp/$t-$i.log 2>&1
  done
done
# hit-heavy relay
for i in 1 2; do
  for t in $(ord $i); do
    run $t -m kvgate.middleware.cli bench throughput --targets kvgate_relay --mixes hit_heavy --concurrency 32,128 --json $D/hh/$t-$i.json > $D/hh/$t-$i.log 2>&1
  done
done
# router overhead on an idle machine
for i in 1 2; do
  for t in $(ord $((i + 1))); do
    run $t -m kvgate.middleware.cli bench loop-load --rate 40 --duration-s 30 --prompt-words 4180 --conversations 20 --tokenizers text --shapes fresh,continue --json $D/ll/$t-$i.json > $D/ll/$t-$i.log 2>&1
  done
done
echo done > $D/all.done
