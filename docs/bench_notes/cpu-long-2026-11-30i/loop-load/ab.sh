cd /tmp/benchcwd
O=/work/main/docs/bench_notes/cpu-long-2026-11-30i/loop-load
for i in 1 2; do for t in one-hold:/tmp/t_new steps:/work/main; do
n=${t%%:*}
PYTHONPATH=${t#*:} flock /tmp/kvgate-vllm.lock timeout 900 /work/main/.venv/bin/kvgate bench loop-load --rate 40 --duration-s 30 --prompt-words 4180 --conversations 20 --tokenizers text --shapes fresh,continue --json $O/$n-$i.json > $O/$n-$i.log 2>&1
done; done
