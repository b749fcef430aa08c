#!/usr/bin/env bash
# session 19, visit 3: the merge in both warpgroups (branch merge2: CTA k owns columns
# [128 k, +128) of each warpgroup's 256; the copy-landed word sent as soon as the slot
# lands).  Trees: .dev/main (main 29f5ad7), .dev/m2 (merge2), .dev/trace2 (merge2 + stamps).
set -u
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
cd .dev/m2
PYTHONPATH=$PWD timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py \
  tests/test_hopper_wgmma_gpu.py -k "planted_split_merge or cluster" 2>&1 | tail -25 > $OUT/tests.txt
PYTHONPATH=$PWD timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_faults.py \
  -k cluster_merge 2>&1 | tail -25 > $OUT/tests_verify.txt
tail -1 $OUT/tests_verify.txt
tail -3 $OUT/tests.txt; echo "tests $(el)"
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
  PYTHONPATH=$PWD timeout 80 compute-sanitizer --tool $tool python3 /tmp/one.py 2>&1 | grep -E "one ok|ERROR SUMMARY" | sed "s/^/$tool: /"
done
echo "sanitizers $(el)"
cd ../trace2
PYTHONPATH=$PWD timeout 100 python3 probe/merge_trace.py 32 1 1024 128 --graph 2>&1 | grep -v Warn | tee $OUT/trace.txt
echo "== two copies (trace3)"; cd ../trace3
PYTHONPATH=$PWD timeout 100 python3 probe/merge_trace.py 32 1 1024 128 --graph 2>&1 | grep -v Warn | tee $OUT/trace3.txt
echo "trace $(el)"
cd ../m2
PYTHONPATH=$PWD timeout 90 python3 benchmarks/graph_timeline.py --flashmla ../fmlib/libflashmla.so \
  --row 32,1,1024,128 2>&1 | grep -v -i warn | tee $OUT/timeline.txt
echo "timeline $(el)"
cd ../main
OUT=$OUT/ab TREES="main m2" SET=graph ROUNDS=2 bash benchmarks/alt_rows.sh 2>&1 | tail -12
echo "done $(el)"
