#!/bin/bash
cd /tmp/benchcwd
export KVGATE_VLLM_PYTHON=/work/main/.venv-vllm/bin/python
D=/tmp/b64/pcap2
flock /tmp/kvgate-vllm.lock bash -c "
tcpdump -i lo -tt -n -s 0 -B 16384 -w $D/cap.pcap 'tcp and not port 6379' > $D/tcpdump.log 2>&1 &
TP=\$!
env PYTHONPATH=/tmp/snap-36i /work/main/.venv/bin/python -m kvgate.middleware.cli bench vllm --runs 1 --arms kvgate_approximate,sglang,kvgate_precise --tune-conversations 8 --anchor-grid 0.5/8/1.25 --trace /work/shared/data/mooncake_conversation_trace.jsonl --json $D/vllm.json > $D/run.log 2>&1
kill \$TP"
