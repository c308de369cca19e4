#!/bin/bash
# the group commit's gathering (a batch waits while turns add steps, MAX_TURNS at most) against
# b87b47b, alternated; reported runs use --seed 1 (the choice of MAX_TURNS was made on seed 0's)
cd /tmp/benchcwd
PY=/work/main/.venv/bin/python
D=/work/main/docs/bench_notes/cpu-notes-2026-12-02c/gather
# snap-new: b87b47b; snap-g: b87b47b + the gathering; both with feedback-off.diff (KVG_FEEDBACK)
run() { flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-$1 "${@:2}"; }
for i in 1 2 3; do
  if [ $((i % 2)) = 1 ]; then order="new g"; else order="g new"; fi
  for t in $order; do
    run $t $PY -m kvgate.middleware.cli bench throughput --seed 1 --targets kvgate_relay --mixes all_miss,hit_heavy --concurrency 32,128 --requests 12000 --duration-s 30 --json $D/$t-$i.json > $D/$t-$i.log 2>&1
  done
  run g env KVG_FEEDBACK=off $PY -m kvgate.middleware.cli bench throughput --seed 1 --targets kvgate_relay --mixes all_miss --concurrency 32 --requests 12000 --duration-s 30 --json $D/g-fboff-$i.json > $D/g-fboff-$i.log 2>&1
  run g $PY -m kvgate.middleware.cli bench throughput --seed 1 --targets sglang_router --mixes all_miss --concurrency 32 --requests 12000 --duration-s 30 --json $D/sglang-$i.json > $D/sglang-$i.log 2>&1
done
for i in 1 2; do
  if [ $((i % 2)) = 1 ]; then order="new g"; else order="g new"; fi
  for t in $order; do
    run $t $PY -m kvgate.middleware.cli bench loop-load --rate 40 --duration-s 30 --prompt-words 4180 --conversations 20 --tokenizers text --shapes fresh,continue --json $D/ll-$t-$i.json > $D/ll-$t-$i.log 2>&1
  done
done
echo done > $D/done
