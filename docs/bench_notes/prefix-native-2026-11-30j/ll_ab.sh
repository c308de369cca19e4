cd /tmp/benchcwd
O=/work/main/docs/bench_notes/prefix-native-2026-11-30j/loop-load
for i in 1 2; do for bs in 16 64; do for t in dicts:/tmp/t_head native:/tmp/t_nat; do
n=${t%%:*}
PYTHONPATH=${t#*:} flock /tmp/kvgate-vllm.lock timeout 900 /work/main/.venv/bin/kvgate bench loop-load --rate 40 --duration-s 30 --prompt-words 4180 --conversations 20 --tokenizers text --block-size $bs --shapes fresh,continue --json $O/$n-b$bs-$i.json > $O/$n-b$bs-$i.log 2>&1
echo "$n b$bs $i rc=$?"
done; done; done
