#!/usr/bin/env bash
# session 19, visit 5 (prepared, not run: the device time ran out).  The mma_sync and
# few-rows kernels flag metadata planned for the 64-row kernel's cluster merge (NaN, device
# flag 4) instead of writing each half alone: benchmarks/patches/bad_plan_flag.patch (branch
# badplan), applied to a copy of the tree at .dev/bp; its GPU test beside those kernels'
# bad-input tests.  From the repository root with carry [".dev"], ~60 s.
set -u
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 PYTHONUNBUFFERED=1
cd .dev/bp
PYTHONPATH=$PWD timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_wgmma_gpu.py \
  tests/test_hopper_gpu.py -k "cluster_metadata or bad_page or nan_and_the_device_flag" 2>&1 | tail -15
