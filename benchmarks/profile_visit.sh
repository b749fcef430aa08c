#!/usr/bin/env bash
# One GPU visit: (1) does compute-sanitizer racecheck model named barriers with a thread count
# (benchmarks/racecheck_namedbar.cu: ctrl / named / arrive are race-free, racy is not);
# (2) ncu (full set, SASS source counters) on one launch of the 64-row wgmma kernel for the
# memory-bound one-tile row (b=128 s_k=8192 h_q=64) and the compute-bound two-tile row
# (h_q=128).  Reports come back as CSV (details + per-instruction SASS with stall samples).
#   COMMIT=<sha> bash benchmarks/profile_visit.sh
set -u
OUT=${OUT:-$PWD/profile_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit ${COMMIT:-?}"; } | tee "$OUT/env.txt"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)

nvcc -arch=sm_90a -lineinfo -o /tmp/rc benchmarks/racecheck_namedbar.cu
for m in ctrl named arrive racy; do
  /tmp/rc $m
  timeout 30 "$CS" --tool racecheck /tmp/rc $m > "$OUT/rc_$m.log" 2>&1
  echo "racecheck $m rc=$?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/rc_$m.log" | head -1)"
done
echo "racecheck done $(el)"

timeout 60 python3 benchmarks/hopper_one_call.py 128 1 8192 64 --calls 1 || exit 1
for h in 64 128; do
  timeout 150 "$NCU" --set full --import-source yes --clock-control none \
    -k regex:mla_split_wgmma_kernel --launch-skip 1 --launch-count 1 -f -o /tmp/ncu_h$h \
    python3 benchmarks/hopper_one_call.py 128 1 8192 $h --calls 3 > "$OUT/ncu_h$h.log" 2>&1
  echo "ncu h$h rc=$? $(el)"; tail -2 "$OUT/ncu_h$h.log"
  "$NCU" -i /tmp/ncu_h$h.ncu-rep --page details --csv > "$OUT/details_h$h.csv" 2>&1
  "$NCU" -i /tmp/ncu_h$h.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$OUT/sass_h$h.csv.gz"
  "$NCU" -i /tmp/ncu_h$h.ncu-rep --page raw --csv 2>&1 | gzip > "$OUT/raw_h$h.csv.gz"
done
echo "== done $(el)"
for h in 64 128; do
  grep -E '"(Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|L2 Hit Rate|Warp Cycles Per Issued Instruction|Registers Per Thread|SM Frequency)"' "$OUT/details_h$h.csv" | cut -d, -f12- | head -12
done
