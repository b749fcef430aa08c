#!/usr/bin/env bash
# session 17 visit 6 (prepared, not run: the device time ran out): why FlashMLA's graph replay gains ~10 % over its eager calls on
# b128 s_k 8192 h_q 16 and ours ~4 %: one replay's kernels, both sides, 3 rows.
set -u
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
cd .dev/main && PYTHONPATH=$PWD timeout 115 python3 benchmarks/graph_timeline.py \
  --flashmla ../fmlib/libflashmla.so --row 128,1,8192,16 --row 128,1,8192,128 \
  --row 64,1,2048,128,varlen 2>&1 | tee $OUT/timeline.log | grep -v Warning
