#!/usr/bin/env bash
# session 19, visit 4: the merged main (7415d49, .dev/final): the broad GPU test set, the
# verify test that reaches the cluster merge, racecheck on a cluster case; and the two-copy
# stamps (.dev/trace3: merge2 + merge_trace.patch, the slot sent as two copies of 32 rows).
set -u
export MLAGEN_BUILD_JOBS=16 PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
cd .dev/trace3
MLAGEN_CACHE_DIR=/tmp/cache-trace3 PYTHONPATH=$PWD timeout 90 python3 probe/merge_trace.py 32 1 1024 128 --graph 2>&1 | grep -v Warn | tee $OUT/trace3.txt
echo "trace3 $(el)"
cd ../final
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache
PYTHONPATH=$PWD timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_wgmma_gpu.py tests/test_hopper_gpu.py \
  -k "planted or (test_cases and wgmma) or graph or metadata or bad_pages or cluster" 2>&1 | tail -30 > $OUT/tests_broad.txt
grep -E "passed|failed" $OUT/tests_broad.txt | tail -2
PYTHONPATH=$PWD timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_faults.py -k cluster_merge 2>&1 | tail -2
echo "tests $(el)"
cat > /tmp/one.py <<'PY'
import sys
sys.path.insert(0, "tests")
from test_hopper_gpu import inputs, check
from mlagen.schedule.records import Schedule
s = Schedule.build(target="hopper", mainloop="wgmma", rows_per_tile=64, block_kv=64, buffers=2, warps=8)
check(inputs(32, [1024 - 7 * i for i in range(32)], 1, 128, 64, seed=1), True, s)
print("one ok")
PY
PYTHONPATH=$PWD timeout 100 compute-sanitizer --tool racecheck python3 /tmp/one.py > $OUT/racecheck.txt 2>&1
grep -E "one ok|SUMMARY" $OUT/racecheck.txt; grep -c "Race reported" $OUT/racecheck.txt
grep "Race reported" $OUT/racecheck.txt | sed 's/.*between//' | sort | uniq -c | head -8
echo "done $(el)"
