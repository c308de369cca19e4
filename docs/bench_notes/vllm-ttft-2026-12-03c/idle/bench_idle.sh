#!/bin/bash
# kvgate bench idle: 7fad179 (/tmp/snap-41a) against the change (/tmp/snap-41b), alternating, 3 rounds
cd /tmp/benchcwd
D=/work/main/docs/bench_notes/vllm-ttft-2026-12-03c/idle
flock /tmp/kvgate-vllm.lock env PYTHONPATH=/tmp/snap-41b /work/main/.venv/bin/python -m kvgate.middleware.cli bench idle --seconds 60 --replicas 2 --rounds 3 --trees /tmp/snap-41a,/tmp/snap-41b --json $D/bench_idle.json > $D/bench_idle.txt 2>&1
