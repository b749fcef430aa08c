#!/usr/bin/env bash
# s24 visit 5, the final tree's broad checks: the wgmma GPU tests, every planted fault
# (tests/test_hopper_faults.py), one verify with the cluster merge's explicit input, and
# synccheck on the small wgmma cases, `mlagen bench --shape` once more (shapes.py).
#   COMMIT=<sha> OUT=... bash benchmarks/results/s24/v5.sh
set -u
W=/tmp/v5; mkdir -p $W
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-}
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
pack() { tar czf "$OUT/v5.tgz" -C /tmp v5; }
echo "commit ${COMMIT:-?}" > $W/env.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_wgmma_gpu.py > $W/wgmma.log 2>&1
echo "1 wgmma gpu tests rc=$? $(el) $(tail -1 $W/wgmma.log)" | tee -a $W/steps.txt; pack
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_faults.py > $W/faults.log 2>&1
echo "2 planted faults rc=$? $(el) $(tail -1 $W/faults.log)" | tee -a $W/steps.txt; pack
timeout 60 python3 -m mlagen.cli verify schedules/hopper_wgmma.toml --examples 30 > $W/verify.log 2>&1
echo "3 verify rc=$? $(el) $(tail -1 $W/verify.log)" | tee -a $W/steps.txt; pack
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
timeout 60 "$CS" --tool synccheck --error-exitcode 9 python3 benchmarks/wgmma_bench.py small > $W/synccheck.log 2>&1
echo "4 synccheck rc=$? $(el) $(grep -E 'ERROR SUMMARY' $W/synccheck.log | head -1)" | tee -a $W/steps.txt; pack
timeout 90 python3 -m mlagen.cli bench --target hopper --no-progress --shape 4,1,4096,128 \
  --shape 128,2,2048,16 --output $W/shapes > $W/shapes.log 2>&1
echo "5 bench --shape rc=$? $(el)" | tee -a $W/steps.txt; pack
cat $W/steps.txt; grep -E "FAILED" $W/*.log | head; cat $W/shapes.md
