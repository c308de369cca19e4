#!/bin/bash
OUT=$1
for i in $(seq 1 1200); do
  PID=$(pgrep -f "kvgate.middleware.cli serve --config" | head -1)
  [ -n "$PID" ] && break; sleep 0.25
done
sleep 22
/work/main/.venv/bin/py-spy record --gil --nonblocking -r 250 -d 40 -f raw -o $OUT --pid $PID > $OUT.log 2>&1
