#!/usr/bin/env bash
# visit 3: rowsrel's GPU tests, then main / rowsrel / r32 (rowsrel with the 32 class on the
# rows kernel, w8) on the few-rows fixed-length anchor rows, 2 rounds (from .dev/main)
set -u
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
W=/tmp/v3; mkdir -p $W
pack() { tar czf "$OUT/v3.tgz" -C /tmp v3; }
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
(cd ../rowsrel && PYTHONPATH=$PWD timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_wgmma_gpu.py -k "rows" -x > $W/pytest_rowsrel.log 2>&1)
echo "1 rowsrel rows gpu tests rc=$? $(el) $(tail -1 $W/pytest_rowsrel.log)" | tee -a $W/steps.txt; pack
OUT=$W/alt TREES="main rowsrel r32" SET=few ROUNDS=2 bash benchmarks/alt_rows.sh 2>&1 | tail -14
echo "2 alt $(el)" | tee -a $W/steps.txt; pack
