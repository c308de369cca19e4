# old = the session's start (1e00492's code), new = this change; sglang-router in every round
cd /tmp/benchcwd
O=/work/main/docs/bench_notes/engine-discovery-2026-11-30k
for i in 1 2; do for k in refuses drops none; do
  down=1; kind=$k; [ $k = none ] && down=0 && kind=refuses
  for t in old:/tmp/t_fin:kvgate new:/tmp/t_disc:kvgate sglang:/tmp/t_disc:sglang_router; do
    IFS=: read n tree target <<< "$t"
    PYTHONPATH=$tree flock /tmp/kvgate-vllm.lock timeout 900 /work/main/.venv/bin/python $O/down_replica.py \
      --requests 600 --concurrency 16 --down $down --kind $kind --target $target --json $O/$n-$k-$i.json | sed "s/^/$n $k $i: /"
  done
done; done
