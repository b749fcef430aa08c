#!/usr/bin/env bash
# First visit of the next session (prepared in session 14), run from a fresh .dev/main copy of
# main with .dev/launchdep (branch launchdep) and .dev/fmlib beside it:
#   cd .dev/main && COMMIT=<sha> bash ../visits/next.sh        (~330 s)
# 1 launchdep's GPU tests (combine launched through launch_dependent; host code only)
# 2 the bench of record on main (PDL split launch in it), GPU tests, memcheck, verify
# 3 synccheck and racecheck of the wgmma kernels with the PDL launch
set -u
T0=$(date +%s)
W=/tmp/w4; mkdir -p $W
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
(cd ../launchdep && PYTHONPATH=$PWD timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py \
  -k "test_cases or graph or planted_split_merge" > $W/pytest_launchdep.log 2>&1)
echo "0 launchdep gpu tests rc=$? [$(( $(date +%s) - T0 )) s] $(tail -1 $W/pytest_launchdep.log)" | tee -a $W/steps.txt
COMMIT=${COMMIT:-?} FM_LIB=../fmlib/libflashmla.so BUDGET=300 bash benchmarks/short_visit.sh
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in synccheck racecheck; do
  PYTHONPATH=$PWD timeout 60 "$CS" --tool $tool python3 benchmarks/wgmma_bench.py small > $W/$tool.log 2>&1
  echo "7 $tool rc=$? [$(( $(date +%s) - T0 )) s] $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/$tool.log | head -2 | tr '\n' ' ')" | tee -a $W/steps.txt
done
tar czf "$OUT/w4.tgz" -C /tmp w4
