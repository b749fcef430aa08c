#!/usr/bin/env bash
# session 16 visit 6: branch pairmerge (two-split requests merged in the split kernel):
# GPU tests, then the graph and compute sets A/B against main
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
W=/tmp/w12; mkdir -p $W
pack() { tar czf "$OUT/w12.tgz" -C /tmp w12; }
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
(cd .dev/pairmerge && export PYTHONPATH=$PWD &&
 timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_hopper_wgmma_gpu.py -k "pair" > $W/pytest_pair.log 2>&1;
 echo "1 pair tests rc=$? $(el) $(tail -1 $W/pytest_pair.log)" | tee -a $W/steps.txt; pack
 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_wgmma_gpu.py tests/test_hopper_gpu.py -k "(test_cases and not rows) or planted or graph or bad" > $W/pytest_more.log 2>&1;
 echo "2 more tests rc=$? $(el) $(tail -1 $W/pytest_more.log)" | tee -a $W/steps.txt; pack)
cd .dev/main
OUT=$W/alt TREES="main pairmerge" SET=graph ROUNDS=2 bash benchmarks/alt_rows.sh > $W/alt_graph.log 2>&1
echo "3 graph A/B $(el)" | tee -a $W/steps.txt; pack
tail -12 $W/alt/alt.md
OUT=$W/altc TREES="main pairmerge" SET=compute ROUNDS=1 bash benchmarks/alt_rows.sh > $W/alt_compute.log 2>&1
echo "4 compute A/B $(el)" | tee -a $W/steps.txt; pack
cat $W/steps.txt; tail -12 $W/altc/alt.md; grep -E "FAIL|Error|error" $W/pytest_*.log | head -20
