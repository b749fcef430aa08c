#!/usr/bin/env bash
# A short final visit on merged main (~130 s; run from a copy of the tree): the planted-fault
# test of the combine and the wgmma test cases, the bench of record (FM_LIB=libflashmla.so adds
# FlashMLA beside each row), memcheck, one verify.  W=/tmp/w4, tarred
# into $OUT after every step; each step skipped when BUDGET (s, default 300) cannot hold it.
#   COMMIT=<sha> FM_LIB=../fmlib/libflashmla.so BUDGET=280 bash benchmarks/short_visit.sh
set -u
W=/tmp/w4; mkdir -p $W
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-}
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
left() { echo $(( ${BUDGET:-300} - $(date +%s) + T0 )); }
pack() { tar czf "$OUT/w4.tgz" -C /tmp w4; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; nvcc --version | tail -1;
  echo "commit ${COMMIT:-?}"; } > $W/env.txt 2>&1
timeout 70 python3 benchmarks/build_defaults.py > $W/build.log 2>&1
echo "1 build rc=$? $(el) $(tail -1 $W/build.log)" | tee -a $W/steps.txt; pack
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py \
  -k "planted_split_merge or (test_cases and wgmma)" > $W/pytest_gpu.log 2>&1
echo "2 gpu tests rc=$? $(el) $(tail -1 $W/pytest_gpu.log)" | tee -a $W/steps.txt; pack
t=$(left); [[ $t -gt 180 ]] && t=180
timeout $t python3 -m mlagen.cli bench --target hopper --no-progress ${FM_LIB:+--flashmla "$(readlink -f "$FM_LIB")"} --output $W/hopper_bench > $W/bench.log 2>&1
echo "3 bench rc=$? $(el) (limit $t)" | tee -a $W/steps.txt; grep -iE "geomean|host" $W/hopper_bench.md | head -3; pack
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
t=$(left); if [[ $t -gt 25 ]]; then
  timeout $t "$CS" --tool memcheck --error-exitcode 9 python3 benchmarks/wgmma_bench.py small > $W/memcheck.log 2>&1
  echo "4 memcheck rc=$? $(el) $(grep -E 'ERROR SUMMARY' $W/memcheck.log | head -1)" | tee -a $W/steps.txt; pack
fi
t=$(left); if [[ $t -gt 20 ]]; then
  timeout $t python3 -m mlagen.cli verify schedules/hopper_wgmma.toml --examples 30 > $W/verify.log 2>&1
  echo "5 verify rc=$? $(el) $(tail -1 $W/verify.log)" | tee -a $W/steps.txt; pack
fi
grep -E "^\| [0-9]" $W/hopper_bench.md 2>/dev/null | tail -62
