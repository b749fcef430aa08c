#!/usr/bin/env bash
# visit 4 (from .dev/main): wholereq's metadata GPU tests, A/B main vs wholereq on the memory
# set (2 rounds), then the bench of record etc. on wholereq (86a69c5) via short_visit.sh
set -u
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
W=/tmp/v4; mkdir -p $W
pack() { tar czf "$OUT/v4.tgz" -C /tmp v4; }
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
(cd ../wholereq && PYTHONPATH=$PWD timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py -k "metadata or test_cases or graph" > $W/pytest_wholereq.log 2>&1)
echo "1 wholereq gpu tests rc=$? $(el) $(tail -1 $W/pytest_wholereq.log)" | tee -a $W/steps.txt; pack
OUT=$W/alt TREES="main wholereq" SET=memory ROUNDS=2 bash benchmarks/alt_rows.sh 2>&1 | tail -18
echo "2 alt $(el)" | tee -a $W/steps.txt; pack
(cd ../wholereq && COMMIT=86a69c5 FM_LIB=../fmlib/libflashmla.so BUDGET=200 bash benchmarks/short_visit.sh > $W/short.log 2>&1)
echo "3 short_visit $(el)" | tee -a $W/steps.txt; cp -r /tmp/w4 $W/ 2>/dev/null; grep -E "^[0-9] |geomean|FlashMLA timed" $W/short.log; pack
