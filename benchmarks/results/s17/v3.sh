#!/usr/bin/env bash
# session 17 visit 3: host time main vs hostpack, each process pinned to one core
# (taskset), alternating; and what the host's CPUs are (the per-process spread of s17v2).
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
W=/tmp/s17v3; mkdir -p $W
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
{ lscpu; cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>&1; nproc; cat /proc/loadavg; } > $W/cpu.txt 2>&1
grep -E "Model name|MHz|NUMA|Thread|Socket" $W/cpu.txt
for t in main hp; do
  (cd .dev/$t && PYTHONPATH=$PWD timeout 120 python3 -c "
from mlagen.backends.hopper import bench; c = bench.Caller(1, 1, 1024, 16, False); c(); print(bench.check_output(c))") > $W/warm_$t.log 2>&1
  echo "warm $t $(tail -1 $W/warm_$t.log) $(el)"
done
for core in 3 11; do
  for i in 1 2 3; do
    for t in main hp; do
      (cd .dev/$t && PYTHONPATH=$PWD timeout 60 taskset -c $core python3 benchmarks/hopper_host_breakdown.py) > $W/host_${t}_c${core}_$i.log 2>&1
      echo "host $t core $core #$i: $(grep -E '^(call x30|call x300|ctypes|plan.run)' $W/host_${t}_c${core}_$i.log | tr '\n' ';') $(el)" | tee -a $W/steps.txt
    done
  done
done
tar czf "$OUT/s17v3.tgz" -C /tmp s17v3
