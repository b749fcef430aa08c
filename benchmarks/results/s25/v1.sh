#!/usr/bin/env bash
# s25 visit 1: the combine's first step loaded beside the lse loads (branch cmbload) against
# main: GPU tests of the combine paths on cmbload, the graph rows alternating the trees
# (alt_rows.sh, 2 rounds), one graph replay's kernels on b16 s_q 2 and b32 in each tree.
# Trees: .dev/main (main 16f6742), .dev/cmb (cmbload).  From the repository root, carry [".dev"].
#   COMMIT=<sha> OUT=... bash benchmarks/results/s25/v1.sh
set -u
W=/tmp/v1; mkdir -p $W
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
pack() { tar czf "$OUT/v1.tgz" -C /tmp v1; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader; echo "commit ${COMMIT:-?}"; } > $W/env.txt 2>&1
cd .dev/cmb
PYTHONPATH=$PWD timeout 90 python3 benchmarks/build_defaults.py > $W/build_cmb.log 2>&1 &
(cd ../main && PYTHONPATH=$PWD timeout 90 python3 benchmarks/build_defaults.py > $W/build_main.log 2>&1) &
wait; echo "1 builds $(el)" | tee -a $W/steps.txt
PYTHONPATH=$PWD timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py \
  tests/test_hopper_wgmma_gpu.py -k "planted_split_merge or (test_cases and wgmma) or bad_input or bad_pages or cuda_graph" \
  > $W/pytest_gpu.log 2>&1
echo "2 gpu tests rc=$? $(el) $(tail -1 $W/pytest_gpu.log)" | tee -a $W/steps.txt; pack
cd ../main
OUT=$W/ab TREES="main cmb" SET=graph ROUNDS=2 ROW_TIMEOUT=80 bash benchmarks/alt_rows.sh > $W/ab.log 2>&1
echo "3 ab rc=$? $(el)" | tee -a $W/steps.txt; pack
for t in main cmb; do
  (cd ../$t && PYTHONPATH=$PWD timeout 60 python3 benchmarks/graph_timeline.py --row 16,2,2048,64 \
    --row 32,1,1024,128 2>&1 | grep -v -i warn | sed "s/^/$t: /") >> $W/timeline.log
  echo "4 timeline $t $(el)" | tee -a $W/steps.txt; pack
done
cat $W/steps.txt; tail -3 $W/pytest_gpu.log; cat $W/ab/alt.md; grep -E "kernel|span" $W/timeline.log
