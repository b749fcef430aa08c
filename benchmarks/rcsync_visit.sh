#!/usr/bin/env bash
# racecheck visit (prepared 2026-12-02, session 15), from a fresh .dev/main copy of main
# with .dev/rcsyncwarp (branch rcsyncwarp) beside it:  cd .dev/main && bash benchmarks/rcsync_visit.sh
# 1 racecheck of benchmarks/racecheck_namedbar.cu: named / diverge / diverge_sw (does racecheck
#   flag quad-leader stores before a non-aligned barrier.sync?)
# 2 rcsyncwarp: wgmma GPU cases, racecheck + synccheck of wgmma_bench small
# 3 A/B main vs rcsyncwarp on the compute set (the __syncwarp must cost nothing)
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
W=/tmp/w7; mkdir -p $W
pack() { tar czf "$OUT/w7.tgz" -C /tmp w7; }
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
nvcc -gencode=arch=compute_90a,code=sm_90a -lineinfo -o /tmp/rc benchmarks/racecheck_namedbar.cu
for m in named diverge diverge_sw racy; do
  timeout 60 "$CS" --tool racecheck /tmp/rc $m > $W/micro_$m.log 2>&1
  echo "1 micro $m rc=$? $(el) $(grep -E 'values|RACECHECK SUMMARY' $W/micro_$m.log | tr '\n' ' ')" | tee -a $W/steps.txt
done; pack
(cd ../rcsyncwarp && export PYTHONPATH=$PWD &&
 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_wgmma_gpu.py -k "test_cases and not rows or planted" > $W/pytest_rcsw.log 2>&1;
 echo "2 rcsyncwarp gpu tests rc=$? $(el) $(tail -1 $W/pytest_rcsw.log)" | tee -a $W/steps.txt
 for tool in racecheck synccheck; do
   timeout 60 "$CS" --tool $tool python3 benchmarks/wgmma_bench.py small > $W/rcsw_$tool.log 2>&1
   echo "2 rcsyncwarp $tool rc=$? $(el) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/rcsw_$tool.log | head -2 | tr '\n' ' ')" | tee -a $W/steps.txt
 done); pack
OUT=$W/alt TREES="main rcsyncwarp" SET=compute ROUNDS=2 bash benchmarks/alt_rows.sh 2>&1 | tail -20
echo "3 alt $(el)" | tee -a $W/steps.txt; pack
