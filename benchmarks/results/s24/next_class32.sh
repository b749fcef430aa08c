#!/usr/bin/env bash
# Prepared for the next session, not run (the device time ran out): the 32-row class on
# short contexts, where DeepSeek-V3 under TP8 with multi-token prediction lands (h_q 16,
# s_q 2) and which no anchor row has; 128 x 2 x 2048 was 0.93x FlashMLA in a graph
# (docs/hopper.md step 35 (g)).  Three views of the same shapes, ~4-5 min:
#   1. the defaults (the padded 64-row kernel) with FlashMLA beside;
#   2. the few-rows kernel at 32 rows and 8 warps (MLAGEN_HOPPER_WGMMA_KNOBS);
#   3. `mlagen tune --space wgmma` on them: the split cost and tiles that measure best.
#   COMMIT=<sha> FM_LIB=.dev/fmlib/libflashmla.so OUT=... bash benchmarks/results/s24/next_class32.sh
set -u
W=/tmp/c32; mkdir -p $W
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-}
FM=$(readlink -f "$FM_LIB")
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
pack() { tar czf "$OUT/c32.tgz" -C /tmp c32; }
SHAPES="--shape 128,2,2048,16 --shape 64,2,2048,16 --shape 128,2,1024,16 --shape 32,2,4096,16 --shape 128,2,4096,16 --shape 128,1,2048,32"
timeout 150 python3 -m mlagen.cli bench --target hopper --no-progress --flashmla "$FM" $SHAPES \
  --output $W/defaults > $W/defaults.log 2>&1
echo "1 defaults rc=$? $(el)" | tee -a $W/steps.txt; pack
MLAGEN_HOPPER_WGMMA_KNOBS='{"32": [32, 64, 2, 8]}' timeout 120 python3 -m mlagen.cli bench \
  --target hopper --no-progress $SHAPES --output $W/rows32_w8 > $W/rows32_w8.log 2>&1
echo "2 few-rows r32 w8 rc=$? $(el)" | tee -a $W/steps.txt; pack
timeout 200 python3 -m mlagen.cli tune --target hopper --space wgmma --no-progress $SHAPES \
  --table $W/tune.json > $W/tune.log 2>&1
echo "3 tune rc=$? $(el)" | tee -a $W/steps.txt; pack
cat $W/steps.txt; grep -E "^\| [0-9]" $W/defaults.md $W/rows32_w8.md; tail -20 $W/tune.log
