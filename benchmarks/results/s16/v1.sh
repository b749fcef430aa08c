#!/usr/bin/env bash
# session 16 visit 1: the prepared racecheck visit, then the split probe (graph rows' split /
# combine times, and the fixed cost per CTA) on main
set -u
cd .dev/main
T0=$(date +%s)
bash benchmarks/rcsync_visit.sh 2>&1 | tail -30
W=/tmp/w7
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
PYTHONPATH=$PWD timeout 90 python3 benchmarks/hopper_split_probe.py --quick --out $W/split_quick.json > $W/split_quick.log 2>&1
echo "4 split quick rc=$? $(( $(date +%s) - T0 )) s" | tee -a $W/steps.txt
PYTHONPATH=$PWD timeout 120 python3 benchmarks/hopper_split_probe.py --overhead --out $W/split_overhead.json > $W/split_overhead.log 2>&1
echo "5 split overhead rc=$? $(( $(date +%s) - T0 )) s" | tee -a $W/steps.txt
tar czf "$OUT/w7.tgz" -C /tmp w7
cat $W/steps.txt; tail -12 $W/split_quick.log; tail -22 $W/split_overhead.log
