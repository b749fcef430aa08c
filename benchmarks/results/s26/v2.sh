#!/usr/bin/env bash
# s26 visit 2: (1) WG1's P V with P from registers (RS wgmma), re-measured on the current
# kernel, and the same with WG1's P barrier kept (rsbar: isolates the operand source from the
# issue order), against main: compute set, 2 alternating rounds, then each tree at the power
# cap; (2) ncu of both split kernels on 128 2 1024 16 on a late launch of a back-to-back loop
# with the caches left warm (s25's open question: FlashMLA's split is 22 % faster back to
# back than alone).  Trees .dev/main, .dev/rs, .dev/rsbar.  ~8 min.
#   COMMIT=<sha> FM_LIB=.dev/fmlib/libflashmla.so OUT=... bash benchmarks/results/s26/v2.sh
set -u
R=$PWD; FM=$(readlink -f "$FM_LIB")
(cd .dev/main && TREES="main rs rsbar" SET=compute ROUNDS=2 POWER=1 OUT=$OUT/alt \
  bash benchmarks/alt_rows.sh 2>&1 | tail -40)
export PYTHONPATH=$R MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 FM_LIB=$FM
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for who in ours fm; do
  k=$([[ $who == ours ]] && echo mla_split_wgmma || echo flash_fwd_splitkv_mla_kernel)
  timeout 120 "$NCU" --cache-control none --clock-control none -k regex:$k \
    --launch-skip 20 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section LaunchStats --section Occupancy -f -o /tmp/warm_$who \
    python3 benchmarks/flashmla/compare.py --one $who 128 2 1024 16 --calls 24 > $OUT/warm_$who.log 2>&1
  echo "ncu warm $who rc=$?"
  "$NCU" -i /tmp/warm_$who.ncu-rep --page details > $OUT/warm_$who.txt 2>&1
done
grep -E "^    (Duration|SM Frequency|DRAM Throughput|L2 Hit Rate|Memory Throughput|Elapsed Cycles|SM Active Cycles)" \
  $OUT/warm_*.txt | sed 's/  */ /g'
