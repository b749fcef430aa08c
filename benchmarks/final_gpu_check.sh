#!/usr/bin/env bash
# One short GPU visit after integration: the GPU tests and `mlagen verify` on the Hopper
# example, most important first (each step time-boxed so a slow one cannot eat the rest).
set -u
export PYTHONUNBUFFERED=1 MLAGEN_CACHE_DIR=/tmp/mlagen-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "commit ${MLAGEN_COMMIT:-unknown}"
timeout 110 python -m pytest -m cuda -q -p no:cacheprovider tests/test_hopper_gpu.py 2>&1 | tee "$OUT/hopper_gpu.log" | tail -4
timeout 70 python -m mlagen.cli verify schedules/hopper_h200.toml --examples 200 --no-progress 2>&1 | tee "$OUT/verify.log" | tail -6
timeout 60 python -m pytest -m cuda -q -p no:cacheprovider tests/test_verify_gpu.py tests/test_reference.py tests/test_problem.py 2>&1 | tee "$OUT/other_gpu.log" | tail -4
