#!/usr/bin/env bash
# session 20, visit 1: the cluster merge's exchanged quarter in fp16 with a per-row
# power-of-two scale (branch x16, docs/hopper.md step 32), and the bad-plan flag of the
# mma_sync / few-rows kernels (session 19's bad_plan_flag.patch, applied on x16).
# Trees: .dev/main (main e432040), .dev/x16 (x16).  From the repository root, carry [".dev"].
set -u
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
cd .dev/x16
PYTHONPATH=$PWD python3 benchmarks/build_defaults.py >/dev/null 2>&1 &
(cd ../main && PYTHONPATH=$PWD python3 benchmarks/build_defaults.py >/dev/null 2>&1) &
wait; echo "builds $(el)"
PYTHONPATH=$PWD timeout 90 python3 benchmarks/graph_timeline.py --flashmla ../fmlib/libflashmla.so \
  --row 32,1,1024,128 2>&1 | grep -v -i warn | tee $OUT/timeline.txt
echo "timeline $(el)"
cd ../main
OUT=$OUT/ab TREES="main x16" SET=graph ROUNDS=2 bash benchmarks/alt_rows.sh 2>&1 | tail -12
echo "ab $(el)"
for t in x16 main; do
  cd ../$t
  for c in 1 0; do
    MLAGEN_HOPPER_CLUSTER=$c PYTHONPATH=$PWD timeout 60 python3 benchmarks/merge_precision.py 2>&1 \
      | grep -v -i warn | sed "s/^/$t: /" | tee -a $OUT/precision.txt
  done
done
echo "precision $(el)"
cd ../x16
PYTHONPATH=$PWD timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_wgmma_gpu.py \
  tests/test_hopper_gpu.py -k "cluster or planted_split_merge or bad_page or nan_and_the_device_flag" \
  2>&1 | tail -25 > $OUT/tests.txt
tail -3 $OUT/tests.txt; echo "tests $(el)"
PYTHONPATH=$PWD timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_faults.py \
  -k cluster_merge 2>&1 | tail -25 > $OUT/tests_verify.txt
tail -1 $OUT/tests_verify.txt; echo "verify $(el)"
cat > /tmp/one.py <<'PY'
import sys
sys.path.insert(0, "tests")
from test_hopper_gpu import inputs, check
from mlagen.schedule.records import Schedule
s = Schedule.build(target="hopper", mainloop="wgmma", rows_per_tile=64, block_kv=64, buffers=2, warps=8)
check(inputs(32, [1024 - 7 * i for i in range(32)], 1, 128, 64, seed=1), True, s)
print("one ok")
PY
for tool in memcheck synccheck; do
  PYTHONPATH=$PWD timeout 70 compute-sanitizer --tool $tool python3 /tmp/one.py 2>&1 | grep -E "one ok|ERROR SUMMARY" | sed "s/^/$tool: /"
done | tee $OUT/sanitizers.txt
echo "done $(el)"
