#!/usr/bin/env bash
# Second profile visit: per-SASS-instruction stall samples of the 64-row wgmma kernel (one
# launch, b=128 s_k=8192 h_q=128; WarpStateStats + SourceCounters only), and racecheck's
# whole report on the two-consumer few-rows kernel (rows2 tree in ../rows2).  At most 8 files
# come back from $OUT.
#   COMMIT=<sha> bash benchmarks/profile2_visit.sh
set -u
OUT=${OUT:-$PWD/profile_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 60 python3 benchmarks/hopper_one_call.py 128 1 8192 128 --calls 1 || exit 1
timeout 120 "$NCU" --section WarpStateStats --section SourceCounters --import-source yes \
  --clock-control none -k regex:mla_split_wgmma_kernel --launch-skip 1 --launch-count 1 -f \
  -o /tmp/ncu_src python3 benchmarks/hopper_one_call.py 128 1 8192 128 --calls 3 > /dev/null 2>&1
echo "ncu rc=$? $(el)"
"$NCU" -i /tmp/ncu_src.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$OUT/sass_h128.csv.gz"
(cd ../rows2 && export PYTHONPATH=$PWD && timeout 40 python3 benchmarks/rows_bench.py small --warps 8 --quick > /dev/null 2>&1;
 timeout 100 "$CS" --tool racecheck --print-limit 40 python3 benchmarks/rows_bench.py small --warps 8 --quick) > "$OUT/rows2_racecheck.log" 2>&1
echo "rows2 racecheck rc=$? $(el)"
grep -E "SUMMARY|and (Write|Read) access" "$OUT/rows2_racecheck.log" | sort | uniq -c | sort -rn | head -12
