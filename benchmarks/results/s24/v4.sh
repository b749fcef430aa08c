#!/usr/bin/env bash
# s24 visit 4: `mlagen bench --target hopper --shape ...` on the GPU, with FlashMLA beside,
# on DeepSeek-V3's decode shapes under tensor parallelism 8 (16 heads a GPU; s_q 2 is
# multi-token prediction).
#   COMMIT=<sha> FM_LIB=.dev/fmlib/libflashmla.so OUT=... bash benchmarks/results/s24/v4.sh
set -u
W=/tmp/v4; mkdir -p $W
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-}
FM=$(readlink -f "$FM_LIB")
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
pack() { tar czf "$OUT/v4.tgz" -C /tmp v4; }
echo "commit ${COMMIT:-?}" > $W/env.txt
timeout 240 python3 -m mlagen.cli bench --target hopper --no-progress --flashmla "$FM" \
  --shape 1,1,8192,16 --shape 8,1,4096,16 --shape 32,2,4096,16 --shape 64,1,16384,16,varlen \
  --shape 128,2,2048,16 --shape 128,1,32768,16 --output $W/tp8_shapes > $W/bench.log 2>&1
echo "1 bench --shape rc=$? $(el)" | tee -a $W/steps.txt; pack
timeout 20 python3 -m mlagen.cli bench --target hopper --shape 1,1,1024 > $W/refused.log 2>&1
echo "2 bad shape rc=$? $(cat $W/refused.log)" | tee -a $W/steps.txt; pack
cat $W/tp8_shapes.md
