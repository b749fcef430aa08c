#!/usr/bin/env bash
# session 16 visit 9: racecheck on cut-down trees of the 64-row kernel: the epilogue without its
# bulk copies, or without its __syncwarp()s (outputs wrong; only the hazard reports matter)
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
W=/tmp/w15; mkdir -p $W
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for t in rc_nobulk rc_nosw; do
  (cd .dev/$t && PYTHONPATH=$PWD timeout 90 "$CS" --tool racecheck python3 benchmarks/wgmma_bench.py small > $W/$t.log 2>&1)
  echo "$t rc=$? $(el) $(grep -E 'RACECHECK SUMMARY' $W/$t.log)" | tee -a $W/steps.txt
  grep -h "Race reported" -A1 $W/$t.log | grep -o "mla_[a-z0-9_]*.cuh:[0-9]*" | sort | uniq -c | tee -a $W/steps.txt
done
tar czf "$OUT/w15.tgz" -C /tmp w15
