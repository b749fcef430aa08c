#!/usr/bin/env bash
# s23 visit 3: the rest of the GPU checks on the C++ call path: the other API tests, verify,
# memcheck of the C++-path tests (outputs from at::empty), the planted faults last.
set -u
W=/tmp/v3; mkdir -p $W
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-}
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
left() { echo $(( ${BUDGET:-500} - $(date +%s) + T0 )); }
pack() { tar czf "$OUT/v3.tgz" -C /tmp v3; }
python3 -c "from mlagen.backends.hopper import fastcall; fastcall.module()" > $W/fastcall.log 2>&1 &
timeout 70 python3 benchmarks/build_defaults.py > $W/build.log 2>&1; wait
echo "1 build rc=$? $(el)" | tee -a $W/steps.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py -k "not hypothesis and not deep and not cpp and not fastcall" > $W/pytest_gpu.log 2>&1
echo "2 other api tests rc=$? $(el) $(tail -1 $W/pytest_gpu.log)" | tee -a $W/steps.txt; pack
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_verify_gpu.py > $W/pytest_verify.log 2>&1
echo "3 verify tests rc=$? $(el) $(tail -1 $W/pytest_verify.log)" | tee -a $W/steps.txt
timeout 60 python3 -m mlagen.cli verify schedules/hopper_wgmma.toml --examples 30 --no-progress > $W/verify.log 2>&1
echo "4 verify rc=$? $(el) $(tail -1 $W/verify.log)" | tee -a $W/steps.txt; pack
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
timeout 150 "$CS" --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py -k "cpp_call_path and not flags" > $W/memcheck.log 2>&1
echo "5 memcheck rc=$? $(el) $(grep -E 'ERROR SUMMARY' $W/memcheck.log | tail -1) $(grep -E 'passed|failed' $W/memcheck.log | tail -1)" | tee -a $W/steps.txt; pack
t=$(left); [[ $t -gt 20 ]] && timeout $t python3 -m pytest -q -p no:cacheprovider tests/test_hopper_faults.py -x > $W/faults.log 2>&1
echo "6 faults rc=$? $(el) (limit $t) $(tail -1 $W/faults.log)" | tee -a $W/steps.txt; pack
