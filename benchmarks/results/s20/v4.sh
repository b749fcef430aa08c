#!/usr/bin/env bash
# session 20, visit 4: the split cost now that the 64-row kernel's partials are fp16 (a
# split costs less to write and combine): trees .dev/main (main, shipped table), .dev/c3 and
# .dev/c4 (the same code; ab.env points MLAGEN_HOPPER_TUNE_TABLE at a table with split_cost
# 3 or 4 on the 64-row entries except b = 1 and b = 32); then the host breakdown in three
# processes.  From the repository root, carry [".dev"].
set -u
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
cd .dev/main
PYTHONPATH=$PWD python3 benchmarks/build_defaults.py >/dev/null 2>&1; echo "builds $(el)"
OUT=$OUT/ab TREES="main c3 c4" SET=compute ROUNDS=2 ROW_TIMEOUT=120 bash benchmarks/alt_rows.sh 2>&1 | tail -22
echo "ab $(el)"
for i in 1 2 3; do
  PYTHONPATH=$PWD timeout 40 python3 benchmarks/hopper_host_breakdown.py 2>&1 | grep -v -i warn \
    | paste -sd";" | sed "s/^/host $i: /" | tee -a $OUT/host.txt
done
echo "done $(el)"
