#!/usr/bin/env bash
# s24 visit 2, the closing visit on the final tree: `mlagen build` with the C++ call path
# built ahead (cold, then cached), the Hopper GPU tests in full plus the CPU tests of the
# C++ path and the bench against this torch, the bench of record with FlashMLA beside
# (graphs replayed 20 times now), memcheck on the small wgmma cases.
#   COMMIT=<sha> FM_LIB=.dev/fmlib/libflashmla.so OUT=... bash benchmarks/results/s24/v2.sh
set -u
W=/tmp/v2; mkdir -p $W
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-}
FM=$(readlink -f "$FM_LIB")
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
left() { echo $(( ${BUDGET:-540} - $(date +%s) + T0 )); }
pack() { tar czf "$OUT/v2.tgz" -C /tmp v2; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader; nvcc --version | tail -1;
  python3 -c 'import torch, sys; print("torch", torch.__version__, sys.version.split()[0])'; echo "commit ${COMMIT:-?}"; } > $W/env.txt 2>&1
timeout 90 python3 -m mlagen.cli build schedules/hopper_wgmma.toml schedules/hopper_wgmma_r16.toml > $W/build1.log 2>&1
echo "1a mlagen build (cold) rc=$? $(el) $(tail -1 $W/build1.log)" | tee -a $W/steps.txt
timeout 30 python3 -m mlagen.cli build schedules/hopper_wgmma.toml > $W/build2.log 2>&1
echo "1b mlagen build (again) rc=$? $(el) $(tail -1 $W/build2.log)" | tee -a $W/steps.txt
timeout 70 python3 benchmarks/build_defaults.py > $W/build.log 2>&1
echo "1c defaults rc=$? $(el) $(tail -1 $W/build.log)" | tee -a $W/steps.txt; pack
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py tests/test_hopper_fastcall.py \
  tests/test_hopper_bench.py > $W/pytest_gpu.log 2>&1
echo "2 gpu tests rc=$? $(el) $(tail -1 $W/pytest_gpu.log)" | tee -a $W/steps.txt; pack
t=$(left); [[ $t -gt 200 ]] && t=200
timeout $t python3 -m mlagen.cli bench --target hopper --no-progress --flashmla "$FM" --output $W/hopper_bench > $W/bench.log 2>&1
echo "3 bench rc=$? $(el) (limit $t)" | tee -a $W/steps.txt; grep -iE "geomean|host|FlashMLA timed" $W/hopper_bench.md | head -3; pack
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
t=$(left); if [[ $t -gt 25 ]]; then
  timeout $t "$CS" --tool memcheck --error-exitcode 9 python3 benchmarks/wgmma_bench.py small > $W/memcheck.log 2>&1
  echo "4 memcheck rc=$? $(el) $(grep -E 'ERROR SUMMARY' $W/memcheck.log | head -1)" | tee -a $W/steps.txt; pack
fi
cat $W/steps.txt; grep -E "FAILED|Error" $W/pytest_gpu.log | head -10
grep -E "^\| [0-9]" $W/hopper_bench.md 2>/dev/null | tail -62
