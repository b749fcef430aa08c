#!/usr/bin/env bash
# Second seesaw visit: several trees under .dev/ (and the repository root = main) built and
# timed on the same rows in one visit; the small correctness case on this tree; ncu on it.
#   TREES="root old_pf seesaw_np seesaw seesaw_ef" (relative to .dev/, root = ../..)
set -u
OUT=${OUT:-$PWD/seesaw_out}; mkdir -p "$OUT"
HERE=$PWD; ROOT=$(cd ../.. && pwd)
export MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
TREES=${TREES:-root old_pf seesaw_np seesaw seesaw_ef}
path() { [ "$1" = root ] && echo "$ROOT" || echo "$ROOT/.dev/$1"; }
for t in $TREES; do
  d=$(path $t)
  (cd "$d" && PYTHONPATH=$d MLAGEN_CACHE_DIR=/tmp/cache-$t timeout 150 python3 -c "
from mlagen.jit import build
from mlagen.backends.hopper import render, defaults
from mlagen.schedule.records import Schedule
s = defaults.canonical(Schedule.build(target='hopper', mainloop='wgmma', rows_per_tile=64, block_kv=64, buffers=2, warps=8))
a = build(render(s)); print(a.path, round(a.seconds, 1))" > "$OUT/build_$t.log" 2>&1; echo "build $t rc=$?") &
done
wait
for t in $TREES; do
  d=$(path $t)
  (cd "$d" && PYTHONPATH=$d MLAGEN_CACHE_DIR=/tmp/cache-$t timeout 100 python3 "$HERE/benchmarks/seesaw_ab.py" "$OUT/t_$t" > "$OUT/time_$t.log" 2>&1; echo "time $t rc=$?")
done
export PYTHONPATH=$HERE MLAGEN_CACHE_DIR=/tmp/cache-$(basename $HERE)
timeout 100 python3 benchmarks/wgmma_bench.py small > "$OUT/small.log" 2>&1; echo "small (this tree) rc=$?"; tail -1 "$OUT/small.log"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 150 "$NCU" --clock-control none -k regex:mla_split_wgmma --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
  python3 benchmarks/seesaw_ncu.py > "$OUT/ncu.txt" 2>&1; echo "ncu rc=$?"
timeout 60 "$NCU" --clock-control none -k regex:mla_split_wgmma --launch-skip 1 --launch-count 1 \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__cycles_elapsed.avg,smsp__cycles_active.avg \
  python3 benchmarks/seesaw_ncu.py > "$OUT/ncu_metrics.txt" 2>&1; echo "ncu metrics rc=$?"
grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|L2 Hit|L1/TEX Hit|Mem Busy|Max Bandwidth|Stall|Warp Cycles|SM Frequency|Elapsed Cycles|gmma|dram__bytes|lts__t_sector|cycles_active|cycles_elapsed" "$OUT/ncu.txt" "$OUT/ncu_metrics.txt" | sed 's/^.*ncu/ncu/' | head -40
if [ -n "${TESTS:-1}" ]; then
  timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/test_hopper_wgmma_gpu.py > "$OUT/pytest_wgmma.log" 2>&1
  echo "pytest wgmma (this tree) rc=$?"; tail -2 "$OUT/pytest_wgmma.log"
  timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/test_hopper_faults.py -k api_defaults > "$OUT/pytest_faults.log" 2>&1
  echo "pytest api defaults verify rc=$?"; tail -2 "$OUT/pytest_faults.log"
fi
for t in $TREES; do [ -f "$OUT/t_$t.json" ] && [ "$t" != root ] && { echo "== root vs $t"; python3 benchmarks/seesaw_ab.py --compare "$OUT/t_root" "$OUT/t_$t"; }; done
true
