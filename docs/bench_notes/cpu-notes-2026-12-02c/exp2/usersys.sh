#!/bin/bash
# user and system CPU of the relay's process over 6 s of an all-miss C=32 cell, per mode
cd /tmp/benchcwd
for m in base bare base bare; do
  PYTHONPATH=/tmp/snap-exp KVX=$m /work/main/.venv/bin/python -m kvgate.middleware.cli bench throughput --targets kvgate_relay --mixes all_miss --concurrency 32 --requests 40000 --duration-s 25 --workdir /tmp/us-$m > /tmp/us-$m.log 2>&1 &
  B=$!
  sleep 9
  P=$(pgrep -f "serve --config /tmp/us-$m/kvgate_relay.yaml" | head -1)
  read -a a < /proc/$P/stat; sleep 6; read -a b < /proc/$P/stat
  echo "$m user $(( ${b[13]} - ${a[13]} )) sys $(( ${b[14]} - ${a[14]} )) ticks in 6 s"
  wait $B; rm -rf /tmp/us-$m
  grep -E "^all_miss +32" /tmp/us-$m.log
done
