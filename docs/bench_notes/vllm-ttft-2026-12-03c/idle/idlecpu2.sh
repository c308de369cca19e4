#!/bin/bash
# per-thread CPU (utime + stime, /proc) of processes $1 ($a) and $2 ($b) over $3 seconds, ms per second
snap() { for v in a b; do p=$([ $v = a ] && echo $1 || echo $2); for t in /proc/$p/task/*; do f=($(sed 's/.*) //' $t/stat)); echo "$v/$(basename $t) $((${f[11]}+${f[12]}))"; done; done | sort; }
snap $1 $2 > /tmp/b41/s0; sleep $3; snap $1 $2 > /tmp/b41/s1
join /tmp/b41/s0 /tmp/b41/s1 | awk -v S=$3 -v T=$(getconf CLK_TCK) '{d=$3-$2; split($1,a,"/"); tot[a[1]]+=d; if(d>0) printf "  %s %.2f ms/s\n", $1, d*1000/T/S} END {for (v in tot) printf "  %s total %.2f ms/s\n", v, tot[v]*1000/T/S}'
