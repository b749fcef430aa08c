#!/usr/bin/env bash
# s25 visit 4: `mlagen bench --shape` with the decode-step column (8447c2c) on the 32-row
# shapes of step 36 (b) and b16 s_q 2, FlashMLA beside.
#   COMMIT=<sha> FM_LIB=.dev/fmlib/libflashmla.so OUT=... bash benchmarks/results/s25/v4.sh
set -u
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-}
FM=$(readlink -f "$FM_LIB")
timeout 200 python3 -m mlagen.cli bench --target hopper --no-progress --flashmla "$FM" \
  --shape 128,2,1024,16 --shape 128,2,2048,16 --shape 128,1,2048,32 --shape 16,2,2048,64 \
  --output $OUT/shapes > $OUT/shapes.log 2>&1
echo "bench rc=$?"; tail -3 $OUT/shapes.log; grep -E "^\| [0-9]|^- |In the table" $OUT/shapes.md
