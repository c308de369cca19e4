cd /tmp/benchcwd
for i in 1 2 3; do for s in default 0.0005; do
if [ $s = default ]; then unset KVGATE_TEST_SWITCH; else export KVGATE_TEST_SWITCH=$s; fi
PYTHONPATH=/tmp/swi:/work/main flock /tmp/kvgate-vllm.lock timeout 900 /work/main/.venv/bin/kvgate bench loop-load --rate 40 --duration-s 30 --prompt-words 4180 --conversations 20 --tokenizers text --shapes fresh,continue --json /work/b51/swi2/$s-$i.json > /work/b51/swi2/$s-$i.log 2>&1
tail -3 /work/b51/swi2/$s-$i.log
done; done
