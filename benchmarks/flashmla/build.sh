#!/usr/bin/env bash
# Build FlashMLA's April-2025 dense decode (commit 9edee0c) into a plain shared library
# with our C shim, for same-visit timing beside mlagen (benchmarks/flashmla/fm.py).
# Usage: SRC=<FlashMLA checkout at 9edee0c, csrc/cutlass/include from CUTLASS e94e888 (its
# submodule pin: with CUTLASS of 2026-08 the split kernel spills 4.9 M requests and runs 1.4x
# slower)> OUT=<dir> build.sh
# ~3 minutes and ~3 GB of memory for splitkv_mla.cu (FlashMLA's own figure: 182 s).
# The sources from git mirrors of the two repositories (session 21, on the CPU machine, nvcc
# 13.0: 2 min 18 s; the library then travels to the GPU machine in .dev/fmlib):
#   mkdir -p /tmp/fmsrc/csrc/cutlass
#   git --git-dir=<FlashMLA mirror> archive 9edee0c | tar xf - -C /tmp/fmsrc
#   git --git-dir=<CUTLASS mirror> archive e94e888 include | tar xf - -C /tmp/fmsrc/csrc/cutlass
#   SRC=/tmp/fmsrc OUT=.dev/fmlib bash benchmarks/flashmla/build.sh
set -euo pipefail
: "${SRC:?FlashMLA source tree}" "${OUT:?output directory}"
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
flags=(-O3 -std=c++17 -DNDEBUG -D_USE_MATH_DEFINES -DFLASH_MLA_DISABLE_FP16
       -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__
       -U__CUDA_NO_HALF2_OPERATORS__ -U__CUDA_NO_BFLOAT16_CONVERSIONS__
       --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math
       --ptxas-options=-v,--register-usage-level=10
       -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC
       -I"$SRC/csrc" -I"$SRC/csrc/cutlass/include")
objs=()
for f in kernels/get_mla_metadata.cu kernels/mla_combine.cu kernels/splitkv_mla.cu; do
  o="$OUT/$(basename "$f" .cu).o"
  nvcc "${flags[@]}" -c "$SRC/csrc/$f" -o "$o" &
  objs+=("$o")
done
nvcc "${flags[@]}" -c "$here/shim.cu" -o "$OUT/shim.o"
wait
nvcc -shared -gencode=arch=compute_90a,code=sm_90a "${objs[@]}" "$OUT/shim.o" -o "$OUT/libflashmla.so"
echo "built $OUT/libflashmla.so"
