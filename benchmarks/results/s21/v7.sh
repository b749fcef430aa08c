#!/usr/bin/env bash
# s21 visit 7: the two probes after bench.time_back_to_back replaced their own copies
# (4531de8), on one row each; FlashMLA beside.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/v7"
cd .dev/final
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
FM=$(readlink -f ../fmlib/libflashmla.so)
timeout 150 python3 benchmarks/graph_layers.py "$OUT/v7/gl.json" --flashmla "$FM" \
  --rows 16,2,2048,64 --modes same,layers,gemm,gemmonly,b2b > "$OUT/v7/graph_layers.log" 2>&1
echo "graph_layers rc=$?"; cat "$OUT/v7/graph_layers.log" | tail -2
timeout 120 python3 benchmarks/graph_timeline.py --flashmla "$FM" --row 16,2,2048,64 \
  > "$OUT/v7/graph_timeline.log" 2>&1
echo "graph_timeline rc=$?"; tail -12 "$OUT/v7/graph_timeline.log"
