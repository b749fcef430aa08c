#!/usr/bin/env bash
# s25 visit 5: (1) a fault planted in the combine's new load order (.dev/mut: the second
# step reuses the first step's partials) must fail the GPU cases; (2) `mlagen bench --shape`
# with the decode-step column on the 32-row shapes and b16 s_q 2, FlashMLA beside.
#   COMMIT=<sha> FM_LIB=.dev/fmlib/libflashmla.so OUT=... bash benchmarks/results/s25/v5.sh
set -u
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-}
FM=$(readlink -f "$FM_LIB"); R=$PWD
(cd .dev/mut && PYTHONPATH=$PWD timeout 100 python3 -m pytest -q -p no:cacheprovider \
  tests/test_hopper_gpu.py -k "test_cases" > $OUT/mut.log 2>&1; echo "planted fault: pytest rc=$? (1 = caught)"; tail -1 $OUT/mut.log)
export PYTHONPATH=$R
timeout 150 python3 -m mlagen.cli bench --target hopper --no-progress --flashmla "$FM" \
  --shape 128,2,1024,16 --shape 128,2,2048,16 --shape 16,2,2048,64 \
  --output $OUT/shapes > $OUT/shapes.log 2>&1
echo "bench rc=$?"; tail -2 $OUT/shapes.log; grep -E "^\| [0-9]|^- |In the table" $OUT/shapes.md
