#!/usr/bin/env bash
# session 18 visit 5: the cluster merge as its own kernel instance (MERGE); tests, sanitizers,
# graph and compute rows against main 524cc6e (.dev/base)
set -u
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
T0=$(date +%s)
cd .dev/main
echo "== cluster tests"
PYTHONPATH=$PWD timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_wgmma_gpu.py -k cluster 2>&1 | tail -25 > $OUT/tests_cluster.txt
tail -2 $OUT/tests_cluster.txt
echo "== broad tests $(($(date +%s)-T0)) s"
PYTHONPATH=$PWD timeout 110 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_wgmma_gpu.py tests/test_hopper_gpu.py -k "planted or (test_cases and wgmma) or graph or metadata or bad_pages" 2>&1 | tail -40 > $OUT/tests_broad.txt
grep -E "passed|failed|^E .*(assert|parts)" $OUT/tests_broad.txt | head -6
echo "== sanitizers $(($(date +%s)-T0)) s"
cat > /tmp/one.py <<'PY'
import sys, torch
sys.path.insert(0, "tests")
from test_hopper_gpu import inputs, api, check
from mlagen.schedule.records import Schedule
s = Schedule.build(target="hopper", mainloop="wgmma", rows_per_tile=64, block_kv=64, buffers=2, warps=8)
inp = inputs(32, [1024 - 7 * i for i in range(32)], 2, 64, 64, seed=1)
check(inp, True, s)
print("one ok")
PY
for tool in memcheck synccheck; do
  PYTHONPATH=$PWD timeout 60 compute-sanitizer --tool $tool python3 /tmp/one.py 2>&1 | grep -E "one ok|ERROR SUMMARY" | sed "s/^/$tool: /"
done
echo "== graph A/B $(($(date +%s)-T0)) s"
OUT=$OUT/ab TREES="base main" SET=graph ROUNDS=2 bash benchmarks/alt_rows.sh 2>&1 | tail -10
echo "== compute A/B $(($(date +%s)-T0)) s"
OUT=$OUT/abc TREES="base main" SET=compute ROUNDS=1 ROW_TIMEOUT=80 bash benchmarks/alt_rows.sh 2>&1 | tail -8
echo "== done $(($(date +%s)-T0)) s"
