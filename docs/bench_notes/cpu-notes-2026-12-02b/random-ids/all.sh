#!/bin/bash
# start (88512e4) against the final tree with random request ids: long prompts in process, hit-heavy relay
cd /tmp/benchcwd
PY=/work/main/.venv/bin/python
D=/work/b61/ab5
run() { flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-$1 $PY "${@:2}"; }
ord() { if [ $(($1 % 2)) = 1 ]; then echo "head new"; else echo "new head"; fi; }
for i in 1 2 3 4; do
  for t in $(ord $i); do
    run $t -m kvgate.tools.bench.pipeline_cpu --target relay --system-words 4000 --requests 2000 --json $D/ipl/$t-$i.json > $D/ipl/$t-$i.log 2>&1
  done
done
for i in 1 2 3; do
  for t in $(ord $i); do
    run $t -m kvgate.middleware.cli bench throughput --targets kvgate_relay --mixes hit_heavy --concurrency 32,128 --json $D/hh/$t-$i.json > $D/hh/$t-$i.log 2>&1
  done
done
echo done > $D/done
