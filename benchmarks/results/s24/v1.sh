#!/usr/bin/env bash
# s24 visit 1: issue 8's closing measurements on main (kernels of e5befb0, host path of
# 6eee23c): GPU tests, the bench of record with FlashMLA timed beside each row, clock and
# power at the cap on two compute rows (ours and FlashMLA in turn), and one graph replay's
# kernels on the four graph rows whose bars are missed (ours and FlashMLA).
#   COMMIT=<sha> FM_LIB=../fmlib/libflashmla.so OUT=... bash benchmarks/results/s24/v1.sh
set -u
W=/tmp/v1; mkdir -p $W
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-}
FM=$(readlink -f "$FM_LIB"); export FM_LIB=$FM
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
left() { echo $(( ${BUDGET:-540} - $(date +%s) + T0 )); }
pack() { tar czf "$OUT/v1.tgz" -C /tmp v1; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader; nvcc --version | tail -1;
  python3 -c 'import torch, sys; print("torch", torch.__version__, sys.version.split()[0])'; echo "commit ${COMMIT:-?}"; } > $W/env.txt 2>&1
timeout 70 python3 benchmarks/build_defaults.py > $W/build.log 2>&1
echo "1 build rc=$? $(el) $(tail -1 $W/build.log)" | tee -a $W/steps.txt; pack
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py \
  -k "planted_split_merge or (test_cases and wgmma) or cpp_call_path" > $W/pytest_gpu.log 2>&1
echo "2 gpu tests rc=$? $(el) $(tail -1 $W/pytest_gpu.log)" | tee -a $W/steps.txt; pack
timeout 200 python3 -m mlagen.cli bench --target hopper --no-progress --flashmla "$FM" --output $W/hopper_bench > $W/bench.log 2>&1
echo "3 bench rc=$? $(el)" | tee -a $W/steps.txt; grep -iE "geomean|host" $W/hopper_bench.md | head -3; pack
for row in "128 1 8192 128" "128 2 16384 128"; do
  t=$(left); [[ $t -lt 40 ]] && break
  timeout $t python3 benchmarks/flashmla/compare.py --power $row >> $W/power.log 2>&1
  echo "4 power $row rc=$? $(el)" | tee -a $W/steps.txt; pack
done
t=$(left); if [[ $t -gt 30 ]]; then
  timeout $t python3 benchmarks/graph_timeline.py --flashmla "$FM" --row 16,2,2048,64 \
    --row 64,1,2048,128,varlen --row 128,1,8192,16 --row 128,1,8192,128 > $W/timeline.log 2>&1
  echo "5 timeline rc=$? $(el)" | tee -a $W/steps.txt; pack
fi
cat $W/steps.txt; cat $W/power.log; grep -E "^row|split|combine" $W/timeline.log | head -40
grep -E "^\| [0-9]" $W/hopper_bench.md 2>/dev/null | tail -62
