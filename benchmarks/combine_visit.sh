#!/usr/bin/env bash
# One short GPU visit for a change to the combine kernel: the GPU cases that split
# (test_cases: mma_sync and wgmma defaults), the planted bad-split-merge fault, then the
# split probe (graph rows: split and combine kernels apart).  Table last.
set -u
OUT=${OUT:-$PWD/combine_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_hopper_gpu.py \
  -k "test_cases or cuda_graph or metadata_matches" > "$OUT/pytest_gpu.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$OUT/pytest_gpu.log"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_faults.py -k "bad_split or example_passes" \
  > "$OUT/pytest_faults.log" 2>&1
echo "faults rc=$?"; tail -3 "$OUT/pytest_faults.log"
timeout 120 python3 benchmarks/hopper_split_probe.py --out "$OUT/probe.json" > "$OUT/probe.log" 2>&1
echo "probe rc=$?"; grep -E "^\||^fixed" "$OUT/probe.log"
