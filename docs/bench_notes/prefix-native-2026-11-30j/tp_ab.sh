cd /tmp/benchcwd
O=/work/main/docs/bench_notes/prefix-native-2026-11-30j/throughput
for i in 1 2 3; do for t in dicts:/tmp/t_head native:/tmp/t_fin; do
n=${t%%:*}
PYTHONPATH=${t#*:} flock /tmp/kvgate-vllm.lock timeout 900 /work/main/.venv/bin/kvgate bench throughput --targets kvgate_router,sglang_router --mixes all_miss --concurrency 32 --json $O/$n-$i.json > $O/$n-$i.log 2>&1
echo "$n $i rc=$?"
done; done
