#!/usr/bin/env bash
# s21 visit 8: `mlagen bench --quick` with FlashMLA on the final head (Caller.decode, the step
# column), from a copy of the tree in .dev/final.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/v8"
cd .dev/final && export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
timeout 200 python3 -m mlagen.cli bench --target hopper --quick --no-progress \
  --flashmla "$(readlink -f ../fmlib/libflashmla.so)" --output "$OUT/v8/bench_quick" > "$OUT/v8/bench.log" 2>&1
echo "bench rc=$?"; sed -n '/CUDA-graph rows/,$p' "$OUT/v8/bench_quick.md"
