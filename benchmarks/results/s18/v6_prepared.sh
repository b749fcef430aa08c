#!/usr/bin/env bash
# session 18, prepared for the next session's first visit (not run: the device time ran out).
# From the repository root with carry [".dev"]: .dev/main = the tree, .dev/fmlib/libflashmla.so
# = benchmarks/flashmla/build.sh's output (rebuild it on the CPU first, ~3 min).
# (1) the combine's planted-fault test as changed at 95e1b0c (never run on a GPU) and the
# cluster tests; (2) racecheck on a cluster-merge case; (3) ncu of one b = 32 split launch,
# the cluster merge against MLAGEN_HOPPER_CLUSTER=0, to split the ~6 us that the merge costs
# over a split kernel that writes no partials (docs/hopper.md step 30 (e)); (4) session 17's
# graph_timeline.py (FlashMLA's graph gain on b128 h_q 16).  ~300 s.
set -u
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
cd .dev/main
PYTHONPATH=$PWD timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py \
  tests/test_hopper_wgmma_gpu.py -k "planted_split_merge or cluster" 2>&1 | tail -3
echo "tests $(el)"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
cat > /tmp/one.py <<'PY'
import sys
sys.path.insert(0, "tests")
from test_hopper_gpu import inputs, check
from mlagen.schedule.records import Schedule
s = Schedule.build(target="hopper", mainloop="wgmma", rows_per_tile=64, block_kv=64, buffers=2, warps=8)
check(inputs(32, [1024 - 7 * i for i in range(32)], 1, 128, 64, seed=1), True, s)
print("one ok")
PY
PYTHONPATH=$PWD timeout 120 "$CS" --tool racecheck python3 /tmp/one.py 2>&1 | grep -E "one ok|SUMMARY" | sed 's/^/racecheck: /'
echo "racecheck $(el)"
for c in 1 0; do
  MLAGEN_HOPPER_CLUSTER=$c PYTHONPATH=$PWD timeout 100 "$NCU" --set full --clock-control none \
    -k regex:mla_split_wgmma_kernel --launch-skip 2 --launch-count 1 -f -o /tmp/ncu_c$c \
    python3 benchmarks/hopper_one_call.py 32 1 1024 128 --calls 4 > $OUT/ncu_c$c.log 2>&1
  "$NCU" -i /tmp/ncu_c$c.ncu-rep --page details --csv > $OUT/details_c$c.csv 2>&1
  echo "ncu cluster=$c rc=$? $(el): $(grep -E '"Duration"' $OUT/details_c$c.csv | head -1)"
done
PYTHONPATH=$PWD timeout 115 python3 benchmarks/graph_timeline.py --flashmla ../fmlib/libflashmla.so \
  --row 128,1,8192,16 --row 32,1,1024,128 2>&1 | grep -v Warning | tee $OUT/timeline.log | tail -20
echo "done $(el)"
