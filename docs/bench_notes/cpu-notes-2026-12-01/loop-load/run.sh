#!/bin/bash
# router overhead: the session's start (base) and its end (new2) alternated, order swapped each round
cd /tmp/benchcwd
for i in 1 2; do
  if [ $((i % 2)) = 1 ]; then order="new2 base"; else order="base new2"; fi
  for t in $order; do
    flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-$t /work/main/.venv/bin/python -m kvgate.middleware.cli bench loop-load --rate 40 --duration-s 30 --prompt-words 4180 --conversations 20 --tokenizers text --shapes fresh,continue --json /work/b56/ll/$t-$i.json > /work/b56/ll/$t-$i.log 2>&1
  done
done
