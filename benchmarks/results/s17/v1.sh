#!/usr/bin/env bash
# session 17 visit 1: the prepared racecheck cuts (s16/v9_prepared.sh) and the host-time
# breakdown of main on this visit's host (3 processes).
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
bash benchmarks/results/s16/v9_prepared.sh 2>&1 | tail -30
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
for i in 1 2 3; do
  (cd .dev/main && PYTHONPATH=$PWD python3 benchmarks/hopper_host_breakdown.py) > $OUT/host_main_$i.log 2>&1
  echo "host $i $(el)"; cat $OUT/host_main_$i.log | tr '\n' ';'; echo
done
