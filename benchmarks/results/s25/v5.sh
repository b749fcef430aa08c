#!/usr/bin/env bash
# s25 visit 5 (prepared, not run: the session's device time ran out): (1) a fault planted in
# the combine's new load order (a copy of this tree whose second step reuses the first
# step's partials) must fail the GPU cases; (2) `mlagen bench --shape` with the decode-step
# column (8447c2c) on the 32-row shapes and b16 s_q 2, FlashMLA beside.  ~3 min.
#   COMMIT=<sha> FM_LIB=.dev/fmlib/libflashmla.so OUT=... bash benchmarks/results/s25/v5.sh
set -u
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-}
FM=$(readlink -f "$FM_LIB"); R=$PWD; M=/tmp/mut
rm -rf $M && mkdir -p $M && tar c --exclude=./.dev --exclude=./benchmarks/results . | tar x -C $M
sed -i 's/if (c0 + u0 > 0) load_step(c0 + u0);/if (c0 + u0 > kCombineUnroll) load_step(c0 + u0);/' \
  $M/templates/hopper/include/mla_combine.cuh
grep -q "c0 + u0 > kCombineUnroll" $M/templates/hopper/include/mla_combine.cuh || { echo "fault not planted"; exit 1; }
(cd $M && PYTHONPATH=$M timeout 100 python3 -m pytest -q -p no:cacheprovider \
  tests/test_hopper_gpu.py -k "test_cases" > $OUT/mut.log 2>&1; echo "planted fault: pytest rc=$? (1 = caught)"; tail -1 $OUT/mut.log)
export PYTHONPATH=$R
timeout 150 python3 -m mlagen.cli bench --target hopper --no-progress --flashmla "$FM" \
  --shape 128,2,1024,16 --shape 128,2,2048,16 --shape 16,2,2048,64 \
  --output $OUT/shapes > $OUT/shapes.log 2>&1
echo "bench rc=$?"; tail -2 $OUT/shapes.log; grep -E "^\| [0-9]|^- |In the table" $OUT/shapes.md
