#!/usr/bin/env bash
# s21 visit 9: compute-sanitizer on the kernels as they are since session 20's fp16 partials
# (synccheck had not run since): synccheck on wgmma_bench.py small (64-row kernel, fp16
# partials and the combine, bf16 and fp16), on the cluster-merge instance (b32 h_q 128) and
# on the few-rows kernel (b8 h_q 16 varlen); memcheck on the cluster-merge instance.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/v9"
cd .dev/final && export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 \
  MLAGEN_HOPPER_CHECK_INDICES=0
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
python3 benchmarks/hopper_one_call.py 32 1 1024 128 --api-defaults --calls 1 > /dev/null 2>&1  # builds
python3 benchmarks/hopper_one_call.py 8 1 8192 16 --varlen --api-defaults --calls 1 > /dev/null 2>&1
run() { local name=$1; shift; timeout 150 "$CS" "$@" > "$OUT/v9/$name.log" 2>&1; \
  echo "$name rc=$? $(grep -E 'ERROR SUMMARY|small: ok' "$OUT/v9/$name.log" | tr '\n' ' ')"; }
run sync_small --tool synccheck --error-exitcode 9 python3 benchmarks/wgmma_bench.py small
run sync_merge --tool synccheck --error-exitcode 9 python3 benchmarks/hopper_one_call.py 32 1 1024 128 --api-defaults --calls 2
run sync_rows --tool synccheck --error-exitcode 9 python3 benchmarks/hopper_one_call.py 8 1 8192 16 --varlen --api-defaults --calls 2
run mem_merge --tool memcheck --error-exitcode 9 python3 benchmarks/hopper_one_call.py 32 1 1024 128 --api-defaults --calls 2
