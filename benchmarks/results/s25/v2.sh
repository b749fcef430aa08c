#!/usr/bin/env bash
# s25 visit 2: main with the combine's early loads.  (1) one graph replay's kernels, ours
# and FlashMLA's, on the 32-row shapes that lost in a graph (next_class32: 128 x 2 x 1024 /
# 2048 x 16, 128 x 1 x 2048 x 32); (2) the combine's GPU tests and planted fault;
# (3) memcheck / synccheck on combines of both instances (few splits a row and many, fp16
# and fp32 partials); (4) the bench of record with FlashMLA beside.
#   COMMIT=<sha> FM_LIB=.dev/fmlib/libflashmla.so OUT=... bash benchmarks/results/s25/v2.sh
set -u
W=/tmp/v2; mkdir -p $W
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-} PYTHONUNBUFFERED=1
FM=$(readlink -f "$FM_LIB")
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
pack() { tar czf "$OUT/v2.tgz" -C /tmp v2; }
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader; echo "commit ${COMMIT:-?}"; } > $W/env.txt 2>&1
timeout 90 python3 benchmarks/build_defaults.py > $W/build.log 2>&1
echo "1 build rc=$? $(el) $(tail -1 $W/build.log)" | tee -a $W/steps.txt
cat > /tmp/one.py <<'PY'
import sys
sys.path.insert(0, "tests")
from test_hopper_gpu import inputs, check
check(inputs(1, [32768 - 5], 1, 128, 64, seed=1), True)           # ~64 splits: 8 a step, fp16
check(inputs(8, [8191 - 900 * i for i in range(8)], 1, 16, 64, seed=2), True)   # rows kernel, fp32
check(inputs(32, [1024 - 7 * i for i in range(32)], 1, 128, 64, seed=3), True)  # 2 a step
check(inputs(3, [0, 1, 4097], 2, 64, 64, seed=4), True)                          # empty splits
print("one ok")
PY
for tool in memcheck synccheck; do
  timeout 80 "$CS" --tool $tool python3 /tmp/one.py 2>&1 | grep -E "one ok|ERROR SUMMARY" | sed "s/^/$tool: /"
done | tee $W/sanitizers.txt
echo "4 sanitizers $(el)" | tee -a $W/steps.txt; pack
timeout 100 python3 benchmarks/graph_timeline.py --flashmla "$FM" --row 128,2,1024,16 \
  --row 128,2,2048,16 --row 128,1,2048,32 2>&1 | grep -v -i warn > $W/timeline.log
echo "2 timeline rc=$? $(el)" | tee -a $W/steps.txt; pack
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py tests/test_hopper_faults.py \
  -k "split_merge or combine or test_cases or cuda_graph" > $W/pytest_gpu.log 2>&1
echo "3 gpu tests rc=$? $(el) $(tail -1 $W/pytest_gpu.log)" | tee -a $W/steps.txt; pack
timeout 230 python3 -m mlagen.cli bench --target hopper --no-progress --flashmla "$FM" --output $W/hopper_bench > $W/bench.log 2>&1
echo "5 bench rc=$? $(el)" | tee -a $W/steps.txt; pack
cat $W/steps.txt; tail -2 $W/pytest_gpu.log; cat $W/sanitizers.txt; grep -E "^row|kernel|span" $W/timeline.log
grep -iE "geomean|host|FlashMLA timed" $W/hopper_bench.md | head -4; grep -A12 "^CUDA-graph rows" $W/hopper_bench.md | grep -E "^\| [0-9]"
