#!/usr/bin/env bash
# s21 visit 6: every test of test_hopper_faults.py on b08ed9a (results in v6/faults.log)
cd .dev/final && export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
mkdir -p $OUT/v6
timeout 420 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_faults.py -x --durations=30 > $OUT/v6/faults.log 2>&1
