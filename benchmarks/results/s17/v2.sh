#!/usr/bin/env bash
# session 17 visit 2: (a) racecheck micro modes with the epilogue's staging; (b) host time,
# main vs hostpack, alternating processes; (c) schedule probe on small-batch graph rows;
# (d) GPU tests on hostpack (every launch goes through the new C entry).
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
W=/tmp/s17v2; mkdir -p $W
pack() { tar czf "$OUT/s17v2.tgz" -C /tmp s17v2; }
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
( cd .dev/hp/benchmarks && nvcc -gencode=arch=compute_90a,code=sm_90a -lineinfo -o $W/rc racecheck_namedbar.cu ) > $W/nvcc_rc.log 2>&1
for m in kshape kstage kstage32 kstagenb; do
  $W/rc $m > $W/rc_plain_$m.log 2>&1
  timeout 60 "$CS" --tool racecheck $W/rc $m > $W/rc_$m.log 2>&1
  echo "a rc $m: $(cat $W/rc_plain_$m.log) | $(grep -E 'RACECHECK SUMMARY' $W/rc_$m.log) $(el)" | tee -a $W/steps.txt
done
pack
# (b) builds first (warm both trees' b1 h16 variant), then alternate processes
for t in main hp; do
  (cd .dev/$t && PYTHONPATH=$PWD timeout 120 python3 -c "
from mlagen.backends.hopper import bench; c = bench.Caller(1, 1, 1024, 16, False); c(); print(bench.check_output(c))") > $W/warm_$t.log 2>&1
  echo "b warm $t $(tail -1 $W/warm_$t.log) $(el)" | tee -a $W/steps.txt
done
for i in 1 2 3 4; do
  for t in main hp; do
    (cd .dev/$t && PYTHONPATH=$PWD timeout 60 python3 benchmarks/hopper_host_breakdown.py) > $W/host_${t}_$i.log 2>&1
    echo "b host $t $i: $(grep -E '^(call x30|call x300|pack|ctypes|plan.run)' $W/host_${t}_$i.log | tr '\n' ';') $(el)" | tee -a $W/steps.txt
  done
done
pack
# (c) schedules on small-batch graph rows
(cd .dev/hp && PYTHONPATH=$PWD timeout 200 python3 benchmarks/schedule_probe.py \
   --row 32,1,1024,128 --row 16,2,2048,64 --row 4,1,4096,128 \
   --sched r64_w8_s1 --sched r32_w8_s1 --sched r32_w8_s2 --sched r32_w8_sauto) > $W/probe.log 2>&1
echo "c probe rc=$? $(el)" | tee -a $W/steps.txt; cat $W/probe.log | tail -8; pack
# (d) GPU tests on hostpack
(cd .dev/hp && PYTHONPATH=$PWD timeout 230 python3 -m pytest -q -p no:cacheprovider \
   tests/test_hopper_wgmma_gpu.py tests/test_hopper_gpu.py -k "test_cases or planted or graph or bad or strict" ) > $W/pytest.log 2>&1
echo "d gpu tests rc=$? $(tail -1 $W/pytest.log) $(el)" | tee -a $W/steps.txt
grep -E "FAILED|Error" $W/pytest.log | head -10
pack
cat $W/steps.txt
