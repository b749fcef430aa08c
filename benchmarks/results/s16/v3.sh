#!/usr/bin/env bash
# session 16 visit 3: racecheck micro modes kwait / kfence, branch rcfence's racecheck
set -u
cd .dev/main
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
W=/tmp/w9; mkdir -p $W
pack() { tar czf "$OUT/w9.tgz" -C /tmp w9; }
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
nvcc -gencode=arch=compute_90a,code=sm_90a -lineinfo -o /tmp/rc benchmarks/racecheck_namedbar.cu
for m in kwait kfence kshape; do
  timeout 60 "$CS" --tool racecheck /tmp/rc $m > $W/micro_$m.log 2>&1
  echo "1 micro $m rc=$? $(el) $(grep -E 'values|WRONG|RACECHECK SUMMARY' $W/micro_$m.log | tr '\n' ' ')" | tee -a $W/steps.txt
done; pack
cd ../rcfence; export PYTHONPATH=$PWD
timeout 150 "$CS" --tool racecheck python3 benchmarks/wgmma_bench.py small > $W/rcfence_racecheck.log 2>&1
echo "2 rcfence racecheck rc=$? $(el) $(grep -E 'small|RACECHECK SUMMARY' $W/rcfence_racecheck.log | tr '\n' ' ')" | tee -a $W/steps.txt
grep -h "Race reported" -A1 $W/rcfence_racecheck.log | grep -o "mla_[a-z0-9_]*.cuh:[0-9]*" | sort | uniq -c | tee -a $W/steps.txt
pack; cat $W/steps.txt
