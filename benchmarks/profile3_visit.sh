#!/usr/bin/env bash
# Fixed-cost profile visit (docs/hopper.md next steps 8): ncu on one launch of the 64-row
# wgmma split kernel where every CTA has one token (b=66 h_q=128 s_k=1, split_kv 1: the
# kernel's cost with no main loop to speak of) and on the b=32 s_k=1024 h_q=128 graph row;
# per-SASS-instruction stall samples (csv.gz) and the usual sections (text).
#   COMMIT=<sha> bash benchmarks/profile3_visit.sh
set -u
OUT=${OUT:-$PWD/profile_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 60 python3 benchmarks/hopper_one_call.py 66 1 1 128 --split-kv 1 --calls 1 || exit 1
timeout 60 python3 benchmarks/hopper_one_call.py 32 1 1024 128 --calls 1 || exit 1
prof() {  # name, workload args
  local name=$1; shift
  timeout 120 "$NCU" --set full --import-source yes --clock-control none \
    -k regex:mla_split_wgmma_kernel --launch-skip 2 --launch-count 1 -f \
    -o /tmp/ncu_$name python3 benchmarks/hopper_one_call.py "$@" --calls 4 > /dev/null 2>&1
  echo "ncu $name rc=$? $(el)"
  "$NCU" -i /tmp/ncu_$name.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$OUT/sass_$name.csv.gz"
  "$NCU" -i /tmp/ncu_$name.ncu-rep --page details > "$OUT/details_$name.txt" 2>&1
  "$NCU" -i /tmp/ncu_$name.ncu-rep --page raw --csv 2>&1 | gzip > "$OUT/raw_$name.csv.gz"
}
prof one 66 1 1 128 --split-kv 1
prof b32 32 1 1024 128
grep -E "^  [A-Za-z].*(Duration|SM Active Cycles|Elapsed Cycles|Executed Ipc A|Registers Per|Block Limit Shared|No Eligible|Issued Warp)" "$OUT"/details_*.txt | head -40
