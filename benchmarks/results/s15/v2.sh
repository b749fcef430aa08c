#!/usr/bin/env bash
# visit 2 of session 15: memory-row diagnostics + tune re-run (from .dev/main)
set -u
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
W=/tmp/v2; mkdir -p $W
pack() { tar czf "$OUT/v2.tgz" -C /tmp v2; }
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
nvcc -O3 -arch=sm_90a -std=c++17 -I templates/hopper/include benchmarks/tma_stream_probe.cu -o /tmp/tma_probe > $W/nvcc.log 2>&1
echo "1 probe build rc=$? $(el)" | tee -a $W/steps.txt
for f in const rand; do timeout 60 /tmp/tma_probe 128 16384 $f -1 0 500 1000 1500 2000 2500 > $W/probe_$f.txt 2>&1; echo "2 probe $f rc=$? $(el)" | tee -a $W/steps.txt; done
timeout 60 /tmp/tma_probe 128 16384 > $W/probe_modes.txt 2>&1; echo "2b probe modes rc=$? $(el)" | tee -a $W/steps.txt
pack
timeout 100 python3 benchmarks/l2_probe.py 256 128 1 16384 16 128 2 16384 16 128 1 16384 64 128 1 8192 16 > $W/l2probe.txt 2>&1
echo "3 l2 probe rc=$? $(el)" | tee -a $W/steps.txt; pack
for r in "128 1 16384 16" "128 2 16384 16" "128 1 16384 64"; do
  FM_LIB=$(readlink -f ../fmlib/libflashmla.so) timeout 50 python3 benchmarks/flashmla/compare.py --power $r >> $W/power.txt 2>&1
  echo "4 power $r rc=$? $(el)" | tee -a $W/steps.txt
done
pack
export MLAGEN_HOPPER_TUNE_TABLE=$W/tuned.json
timeout 200 python3 -m mlagen.cli tune --target hopper --space wgmma --no-progress > $W/tune.log 2>&1
echo "5 tune rc=$? $(el)" | tee -a $W/steps.txt; pack
cat $W/probe_const.txt $W/probe_rand.txt $W/l2probe.txt $W/power.txt | grep -v "^$"
