#!/bin/bash
# per-thread CPU of each idle server over $1 seconds
declare -A P
for v in a b c; do P[$v]=$(pgrep -f "serve --config /tmp/b41/idle-$v.yaml"); done
snap() { for v in a b c; do p=${P[$v]}; for t in /proc/$p/task/*; do f=($(sed 's/.*) //' $t/stat)); echo "$v/$(basename $t) $((${f[11]}+${f[12]}))"; done; done | sort; }
snap > /tmp/b41/s0; sleep $1; snap > /tmp/b41/s1
join /tmp/b41/s0 /tmp/b41/s1 | awk -v S=$1 '{d=$3-$2; split($1,a,"/"); tot[a[1]]+=d; if(d>0) print $1, d*10/S " ms/s"} END {for (v in tot) print v, "total", tot[v]*10/S, "ms/s"}'
