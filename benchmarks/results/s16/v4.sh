#!/usr/bin/env bash
# session 16 visit 4: the split kernel's fixed cost by stage: trees with one stage cut out
# (epilogue stores, Q load, everything after the launch), timing only, 132 CTAs direct
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
W=/tmp/w10; mkdir -p $W
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
for r in 1 2; do
  for t in main fc_noepi fc_noq fc_empty; do
    (cd .dev/$t && PYTHONPATH=$PWD timeout 100 python3 benchmarks/latency_probe.py --h-q 128,64 \
      --blocks 1,2,8 --k dram --no-check --out $W/${t}_r$r.json > $W/${t}_r$r.log 2>&1)
    echo "round $r $t rc=$? $(el) $(tail -2 $W/${t}_r$r.log | tr '\n' ' ')" | tee -a $W/steps.txt
  done
done
tar czf "$OUT/w10.tgz" -C /tmp w10
