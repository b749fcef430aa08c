#!/usr/bin/env bash
# One GPU visit (~2 min + start): which kernel should the 32 class (17-32 packed query rows)
# run now that the 64-row kernel has its slice barriers (docs/hopper.md, next step 11)?
# The same tree twice in one visit: A = the padded 64-row kernel (MLAGEN_HOPPER_WGMMA_KNOBS
# override), B = the default (few-rows kernel, 32 rows, two consumer warpgroups), on the
# 12 anchor rows of the class; then the table (A/B > 1: the default is faster).
#   COMMIT=<sha> bash benchmarks/class32_visit.sh
set -u
OUT=${OUT:-$PWD/class32_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
echo "commit ${COMMIT:-?}; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" | tee "$OUT/env.txt"
MLAGEN_HOPPER_WGMMA_KNOBS='{"32": [64, 64, 2, 8]}' timeout 150 python3 benchmarks/ab_rows.py "$OUT/A.json" --set class32 > "$OUT/time_A.log" 2>&1
echo "A rc=$?"
timeout 150 python3 benchmarks/ab_rows.py "$OUT/B.json" --set class32 > "$OUT/time_B.log" 2>&1
echo "B rc=$?"
python3 benchmarks/ab_rows.py --compare "$OUT/A.json" "$OUT/B.json" | tee "$OUT/class32.md"
