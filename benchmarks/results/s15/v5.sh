#!/usr/bin/env bash
# visit 5 (from .dev/main at 86a69c5): ncu --set full, per-SASS stall samples, of the 16-row
# kernel on 128 1 8192 16 and the 64-row kernel on 128 1 16384 64 (whole-request plans)
set -u
W=/tmp/v5; mkdir -p $W
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() {  # name, kernel regex, workload args
  local name=$1 k=$2; shift 2
  timeout 60 python3 benchmarks/hopper_one_call.py "$@" --calls 1 > $W/warm_$name.log 2>&1
  timeout 150 "$NCU" --set full --import-source yes --clock-control none \
    -k regex:$k --launch-skip 2 --launch-count 1 -f \
    -o /tmp/ncu_$name python3 benchmarks/hopper_one_call.py "$@" --calls 4 > $W/ncu_$name.log 2>&1
  echo "ncu $name rc=$? $(el)" | tee -a $W/steps.txt
  "$NCU" -i /tmp/ncu_$name.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$W/sass_$name.csv.gz"
  "$NCU" -i /tmp/ncu_$name.ncu-rep --page details > "$W/details_$name.txt" 2>&1
  "$NCU" -i /tmp/ncu_$name.ncu-rep --page raw --csv 2>&1 | gzip > "$W/raw_$name.csv.gz"
  tar czf "$OUT/v5.tgz" -C /tmp v5
}
prof r16_h16 mla_split_wgmma_rows_kernel 128 1 8192 16
prof r64_h64 mla_split_wgmma_kernel 128 1 16384 64
grep -E "^  [A-Za-z].*(Duration|Elapsed Cycles|DRAM Throughput|Executed Ipc A|No Eligible|Issued Warp)" $W/details_*.txt | head -30
