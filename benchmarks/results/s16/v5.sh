#!/usr/bin/env bash
# session 16 visit 5: what the fp32 partials cost on the graph rows: trees writing half of
# them or none (timing only; the combine reads whatever is there)
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
W=/tmp/w11; mkdir -p $W
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
for r in 1 2; do
  for t in main fc_halfpart fc_nopart; do
    (cd .dev/$t && PYTHONPATH=$PWD timeout 100 python3 benchmarks/hopper_split_probe.py --quick \
      --out $W/${t}_r$r.json > $W/${t}_r$r.log 2>&1)
    echo "round $r $t rc=$? $(el)" | tee -a $W/steps.txt
    grep "^| [0-9]" $W/${t}_r$r.log | tee -a $W/steps.txt
  done
done
tar czf "$OUT/w11.tgz" -C /tmp w11
