#!/bin/bash
# the session's measurements, base (bc8fd78) against new, alternated with the order swapped each round
cd /tmp/benchcwd
PY=/work/main/.venv/bin/python
run() { flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-$1 $PY "${@:2}"; }
# in process: the router target's CPU per request
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for t in $order; do
    run $t -m kvgate.tools.bench.pipeline_cpu --requests 6000 --json /work/b57/ip/$t-$i.json > /work/b57/ip/$t-$i.log 2>&1
  done
done
# the goal cell
FIRST=1 LAST=12 /work/b57/tp/run.sh
# hit-heavy relay
for i in 1 2; do
  if [ $((i % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for t in $order; do
    run $t -m kvgate.middleware.cli bench throughput --targets kvgate_relay --mixes hit_heavy --concurrency 32,128 --json /work/b57/hh/$t-$i.json > /work/b57/hh/$t-$i.log 2>&1
  done
done
# router overhead on an idle machine
for i in 1 2; do
  if [ $((i % 2)) = 1 ]; then order="new base"; else order="base new"; fi
  for t in $order; do
    run $t -m kvgate.middleware.cli bench loop-load --rate 40 --duration-s 30 --prompt-words 4180 --conversations 20 --tokenizers text --shapes fresh,continue --json /work/b57/ll/$t-$i.json > /work/b57/ll/$t-$i.log 2>&1
  done
done
echo done > /work/b57/all.done
