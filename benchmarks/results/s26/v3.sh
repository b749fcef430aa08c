#!/usr/bin/env bash
# s26 visit 3: where WG1's P from registers (RS) loses its 6 % of work per clock (v2): ncu
# --set full of the split kernel of main and of rs on 128 1 8192 128 (one launch, clocks left
# alone), with the per-instruction stall samples of the SASS, side by side.  Trees .dev/main,
# .dev/rs.  One tarball back (the tool's file-count limit).  ~3 min.
#   COMMIT=<sha> OUT=... bash benchmarks/results/s26/v3.sh
set -u
R=$PWD
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
mkdir -p /tmp/v3
for t in main rs; do
  (cd .dev/$t && export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache-$t MLAGEN_BUILD_JOBS=16 &&
   timeout 120 python3 benchmarks/flashmla/compare.py --one ours 128 1 8192 128 --calls 1 &&
   timeout 150 "$NCU" --set full --import-source no --clock-control none -k regex:mla_split_wgmma \
     --launch-skip 2 --launch-count 1 -f -o /tmp/v3/$t \
     python3 benchmarks/flashmla/compare.py --one ours 128 1 8192 128 --calls 4 > /tmp/v3/$t.log 2>&1
   echo "ncu $t rc=$?")
  "$NCU" -i /tmp/v3/$t.ncu-rep --page details > /tmp/v3/details_$t.txt 2>&1
  "$NCU" -i /tmp/v3/$t.ncu-rep --page source --csv --print-source sass > /tmp/v3/sass_$t.csv 2>&1
  echo "$t: source rows $(wc -l < /tmp/v3/sass_$t.csv)"
done
tar czf $OUT/v3.tgz -C /tmp/v3 details_main.txt details_rs.txt sass_main.csv sass_rs.csv main.log rs.log
grep -E "^    (Duration|SM Frequency|Elapsed Cycles|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Shared Memory|L1/TEX Cache Throughput)" \
  /tmp/v3/details_*.txt | sed 's/  */ /g'
grep -E "^    Stall|Warp Cycles Per Issued" /tmp/v3/details_main.txt | head -5
