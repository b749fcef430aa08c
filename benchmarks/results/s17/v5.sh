#!/usr/bin/env bash
# session 17 visit 5: the combine prefetch issued behind the first lse loads (.dev/cp2): GPU tests of the
# combine, split/combine times (split probe --quick), graph-row A/B against main.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
W=/tmp/s17v5; mkdir -p $W
pack() { tar czf "$OUT/s17v5.tgz" -C /tmp s17v5; }
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
(cd .dev/cp2 && PYTHONPATH=$PWD timeout 170 python3 -m pytest -q -p no:cacheprovider \
   tests/test_hopper_wgmma_gpu.py tests/test_hopper_gpu.py -k "planted or (test_cases and wgmma) or graph") > $W/pytest.log 2>&1
echo "1 gpu tests rc=$? $(tail -1 $W/pytest.log) $(el)" | tee -a $W/steps.txt
grep -E "FAILED" $W/pytest.log | head -5; pack
for t in main cp2; do
  (cd .dev/$t && PYTHONPATH=$PWD timeout 60 python3 benchmarks/hopper_split_probe.py --quick --out $W/split_$t.json) > $W/split_$t.log 2>&1
  echo "2 split probe $t rc=$? $(el)" | tee -a $W/steps.txt; tail -8 $W/split_$t.log
done
pack
(cd .dev/main && OUT=$W/alt TREES="main cp2" SET=graph ROUNDS=2 bash benchmarks/alt_rows.sh) > $W/alt_graph.log 2>&1
echo "3 graph A/B $(el)" | tee -a $W/steps.txt; tail -14 $W/alt/alt.md; pack
cat $W/steps.txt
