#!/bin/bash
# start (88512e4) against the record-batch trees: long prompts in process and the router overhead (new = 4422634),
# then hit-heavy and the goal cell (new = 68a6d40); D was /work/b61/ab, the snapshots git archive + the built .so files
cd /tmp/benchcwd
PY=/work/main/.venv/bin/python
D=/work/b61/ab
run() { flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-$1 $PY "${@:2}"; }
ord() { if [ $(($1 % 2)) = 1 ]; then echo "head new"; else echo "new head"; fi; }
for i in 1 2 3 4; do
  for t in $(ord $i); do
    run $t -m kvgate.tools.bench.pipeline_cpu --target relay --system-words 4000 --requests 2000 --json $D/ipl/$t-$i.json > $D/ipl/$t-$i.log 2>&1
  done
done
for i in 1 2; do
  for t in $(ord $i); do
    run $t -m kvgate.middleware.cli bench loop-load --rate 40 --duration-s 30 --prompt-words 4180 --conversations 20 --tokenizers text --shapes fresh,continue --json $D/ll/$t-$i.json > $D/ll/$t-$i.log 2>&1
  done
done

for i in 1 2 3; do
  for t in $(ord $i); do
    run $t -m kvgate.middleware.cli bench throughput --targets kvgate_relay --mixes hit_heavy --concurrency 32,128 --json $D/hh/$t-$i.json > $D/hh/$t-$i.log 2>&1
  done
done
for i in 1 2 3 4; do
  for t in $(ord $i); do
    run $t -m kvgate.middleware.cli bench throughput --targets kvgate_relay,kvgate_router,sglang_router --mixes all_miss --concurrency 32 --json $D/tp/$t-$i.json > $D/tp/$t-$i.log 2>&1
  done
done
echo done > $D/tp.done
