#!/usr/bin/env bash
# session 20, visit 2: the 64-row wgmma kernel's split partials in fp16 with a per-row
# power-of-two scale (branch p16, docs/hopper.md step 32 (b)).  Trees: .dev/main (main
# cfa0eed: the merge's exchange in fp16 already), .dev/p16.  From the repository root,
# carry [".dev"].
set -u
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
cd .dev/p16
PYTHONPATH=$PWD python3 benchmarks/build_defaults.py >/dev/null 2>&1 &
(cd ../main && PYTHONPATH=$PWD python3 benchmarks/build_defaults.py >/dev/null 2>&1) &
wait; echo "builds $(el)"
for t in p16 main; do
  cd ../$t
  PYTHONPATH=$PWD timeout 60 python3 benchmarks/graph_timeline.py --row 16,2,2048,64 \
    --row 1,1,32768,128 --row 64,1,2048,128,varlen 2>&1 | grep -v -i warn | sed "s/^/$t: /" \
    | tee -a $OUT/timeline.txt
done
echo "timeline $(el)"
cd ../main
OUT=$OUT/ab TREES="main p16" SET=compute ROUNDS=2 bash benchmarks/alt_rows.sh 2>&1 | tail -22
echo "ab $(el)"
for t in p16 main; do
  cd ../$t
  PYTHONPATH=$PWD timeout 60 python3 benchmarks/merge_precision.py 2>&1 \
    | grep -v -i warn | sed "s/^/$t: /" | tee -a $OUT/precision.txt
done
echo "precision $(el)"
cd ../p16
PYTHONPATH=$PWD timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_wgmma_gpu.py \
  2>&1 | tail -6 > $OUT/tests_wgmma.txt
tail -2 $OUT/tests_wgmma.txt; echo "wgmma tests $(el)"
PYTHONPATH=$PWD timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py \
  -k "planted_split_merge" 2>&1 | tail -6 > $OUT/tests_gpu.txt
tail -2 $OUT/tests_gpu.txt; echo "gpu tests $(el)"
cat > /tmp/one.py <<'PY'
import sys
sys.path.insert(0, "tests")
from test_hopper_gpu import inputs, check
from mlagen.schedule.records import Schedule
s = Schedule.build(target="hopper", mainloop="wgmma", rows_per_tile=64, block_kv=64, buffers=2, warps=8)
check(inputs(16, [2048 - 7 * i for i in range(16)], 2, 64, 64, seed=1), True, s)
print("one ok")
PY
PYTHONPATH=$PWD timeout 60 compute-sanitizer --tool memcheck python3 /tmp/one.py 2>&1 | grep -E "one ok|ERROR SUMMARY" | tee $OUT/sanitizers.txt
echo "done $(el)"
