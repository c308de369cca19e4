#!/bin/bash
# idle CPU of kvgate serve, 7fad179 (PYTHONPATH /tmp/snap-41a) against the change (/tmp/snap-41b),
# both in front of two idle demo backends, approximate mode, 60 s after start-up, then the same with
# the two trees' ports swapped; idlecpu.sh reads each thread's utime + stime from /proc
cd /tmp/benchcwd
PY=/work/main/.venv/bin/python
D=/work/main/docs/bench_notes/vllm-ttft-2026-12-03c/idle
PYTHONPATH=/tmp/snap-41a $PY -m kvgate.middleware.cli demo-backend --port 18001 > /dev/null 2>&1 &
D1=$!
PYTHONPATH=/tmp/snap-41a $PY -m kvgate.middleware.cli demo-backend --port 18002 > /dev/null 2>&1 &
D2=$!
for round in 1 2; do
  rm -rf /tmp/b41/idle-a /tmp/b41/idle-b
  if [ $round = 1 ]; then A=/tmp/snap-41a; B=/tmp/snap-41b; else A=/tmp/snap-41b; B=/tmp/snap-41a; fi
  # a: idle-a.yaml, b: idle.yaml copy with its own cache dir (both default stats settings)
  sed 's/idlecache/idle-b/' $D/idle.yaml > /tmp/b41/idle-b2.yaml
  PYTHONPATH=$A $PY -m kvgate.middleware.cli serve --config $D/idle-a.yaml --port 18101 > /dev/null 2>&1 &
  PA=$!
  PYTHONPATH=$B $PY -m kvgate.middleware.cli serve --config /tmp/b41/idle-b2.yaml --port 18102 > /dev/null 2>&1 &
  PB=$!
  sleep 45
  for i in 1 2 3 4 5; do curl -s -o /dev/null localhost:18101/v1/chat/completions -H 'content-type: application/json' -d '{"model":"m","messages":[{"role":"user","content":"hi"}]}'; curl -s -o /dev/null localhost:18102/v1/chat/completions -H 'content-type: application/json' -d '{"model":"m","messages":[{"role":"user","content":"hi"}]}'; done
  sleep 5
  echo "round $round: a = $A, b = $B"
  bash $D/idlecpu2.sh $PA $PB 60
  kill $PA $PB; wait $PA $PB 2>/dev/null
done
kill $D1 $D2
