#!/usr/bin/env bash
# One visit: FlashMLA (prebuilt libflashmla.so, FM_LIB) beside this tree on the same
# tensors: `mlagen bench --flashmla` (51 eager rows and 8 graph rows, each timed right after
# ours), compare.py --power (the compute row at the power cap), then pair_profile.sh (ncu
# of both sides' split and combine kernels) on b=128 s_k=8192 h_q=128.  Every step writes
# under $OUT as it goes.
#   FM_LIB=.dev/fmlib/libflashmla.so OUT=... bash benchmarks/flashmla/visit.sh
set -u
OUT=${OUT:-$PWD/fm_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
export FM_LIB=$(readlink -f "${FM_LIB:?libflashmla.so}")
HERE=$(cd "$(dirname "$0")" && pwd)
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
timeout ${BENCH_TIMEOUT:-180} python3 -m mlagen.cli bench --target hopper --no-progress \
  ${QUICK:+--quick} --flashmla "$FM_LIB" --output "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc=$? $(el)"; grep -E "geomean|FlashMLA timed" "$OUT/bench.md" 2>/dev/null
timeout 60 python3 "$HERE/compare.py" --power 2>&1 | tee "$OUT/power.txt"; el
[ -n "${NO_NCU:-}" ] || OUT=$OUT/ncu timeout ${NCU_TOTAL:-300} bash "$HERE/pair_profile.sh" 128 1 8192 128
el
