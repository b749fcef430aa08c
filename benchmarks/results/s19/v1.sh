#!/usr/bin/env bash
# session 19, visit 1 (s18/v6_prepared.sh plus the cluster-fit query at sizes 4 and 8 and the
# merge kernel's SASS-level samples).  From the repository root with carry [".dev"]:
# .dev/main = the tree (main 29f5ad7 + cluster_fit sizes), .dev/fmlib/libflashmla.so.
# (1) the combine's planted-fault test as changed at 95e1b0c (never run on a GPU) and the
# cluster tests; (2) racecheck on a cluster-merge case; (3) ncu of one b = 32 split launch,
# the cluster merge against MLAGEN_HOPPER_CLUSTER=0 (where do the merge's ~6 us go), with the
# merge's source page; (4) clusters of 1/2/4/8 resident; (5) graph_timeline.py.
set -u
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
cd .dev/main
python3 benchmarks/cluster_fit.py 2>&1 | tee $OUT/cluster_fit.txt
PYTHONPATH=$PWD timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py \
  tests/test_hopper_wgmma_gpu.py -k "planted_split_merge or cluster" 2>&1 | tail -4
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
PYTHONPATH=$PWD timeout 120 "$CS" --tool racecheck python3 /tmp/one.py 2>&1 | grep -E "one ok|SUMMARY|Error" | head -5 | sed 's/^/racecheck: /'
echo "racecheck $(el)"
for c in 1 0; do
  MLAGEN_HOPPER_CLUSTER=$c PYTHONPATH=$PWD timeout 100 "$NCU" --set full --import-source no --clock-control none \
    -k regex:mla_split_wgmma_kernel --launch-skip 2 --launch-count 1 -f -o /tmp/ncu_c$c \
    python3 benchmarks/hopper_one_call.py 32 1 1024 128 --calls 4 > $OUT/ncu_c$c.log 2>&1
  "$NCU" -i /tmp/ncu_c$c.ncu-rep --page details --csv > $OUT/details_c$c.csv 2>&1
  echo "ncu cluster=$c rc=$? $(el): $(grep -E '"Duration"' $OUT/details_c$c.csv | head -1)"
done
"$NCU" -i /tmp/ncu_c1.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $OUT/sass_c1.csv.gz
PYTHONPATH=$PWD timeout 115 python3 benchmarks/graph_timeline.py --flashmla ../fmlib/libflashmla.so \
  --row 128,1,8192,16 --row 32,1,1024,128 2>&1 | grep -v Warning | tee $OUT/timeline.log | tail -24
echo "done $(el)"
