#!/usr/bin/env bash
# session 16 visit 2: racecheck micro modes quad / kshape, the real kernel's hazards with
# thread ids, and the latency probe (K from DRAM or L2, slope per block)
set -u
cd .dev/main
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
W=/tmp/w8; mkdir -p $W
pack() { tar czf "$OUT/w8.tgz" -C /tmp w8; }
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
nvcc -gencode=arch=compute_90a,code=sm_90a -lineinfo -o /tmp/rc benchmarks/racecheck_namedbar.cu
for m in quad kshape named arrive; do
  timeout 60 "$CS" --tool racecheck /tmp/rc $m > $W/micro_$m.log 2>&1
  echo "1 micro $m rc=$? $(el) $(grep -E 'values|WRONG|RACECHECK SUMMARY' $W/micro_$m.log | tr '\n' ' ')" | tee -a $W/steps.txt
done; pack
export PYTHONPATH=$PWD
timeout 150 "$CS" --tool racecheck --racecheck-report hazard python3 benchmarks/wgmma_bench.py small > $W/rc_hazard_full.log 2>&1
echo "2 racecheck hazard rc=$? $(el) $(grep -c 'Race\|hazard' $W/rc_hazard_full.log)" | tee -a $W/steps.txt
head -c 3000000 $W/rc_hazard_full.log > $W/rc_hazard.log; rm -f $W/rc_hazard_full.log; pack
timeout 150 python3 benchmarks/latency_probe.py --out $W/latency.json > $W/latency.log 2>&1
echo "3 latency rc=$? $(el)" | tee -a $W/steps.txt; pack
cat $W/steps.txt; tail -8 $W/latency.log; grep -m12 -E "Race|thread|block" $W/rc_hazard.log
