#!/usr/bin/env bash
# session 20, visit 6: the broad GPU tests on merged main (the combine's fp32 instance, which
# the mma_sync and few-rows kernels use, changed shape in p16): tests/test_hopper_gpu.py
# (both main loops' cases, hypothesis, graph replay, bad input) and the planted faults /
# verify runs of tests/test_hopper_faults.py.  From the repository root.
set -u
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
python3 benchmarks/build_defaults.py --page16 > /dev/null 2>&1; echo "builds $(el)"
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py tests/test_hopper_faults.py \
  2>&1 | tail -15 | tee $OUT/tests.txt
echo "done $(el)"
