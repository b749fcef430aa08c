#!/usr/bin/env bash
# ncu --set full of mlagen's and FlashMLA's kernels (split and combine) on one bench row, the
# same tensors: the side-by-side that found the L2 lookups of step 24 (docs/hopper.md).
#   FM_LIB=.dev/fmlib/libflashmla.so OUT=... bash benchmarks/flashmla/pair_profile.sh 64 1 2048 128 --varlen
# Per kernel: details_<who>_<kernel>.txt and raw_<who>_<kernel>.csv.gz under $OUT; a short
# table of the headline metrics last.  ~20-40 s a kernel.
set -u
OUT=${OUT:-$PWD/pair_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
export FM_LIB=$(readlink -f "${FM_LIB:?libflashmla.so}")
[[ $# -ge 4 ]] || { echo "usage: pair_profile.sh B S_Q SK H_Q [--varlen]" >&2; exit 2; }
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 120 python3 benchmarks/flashmla/compare.py --one ours "$@" --calls 1 || exit 1
prof() {  # who, kernel tag, kernel regex
  timeout ${NCU_TIMEOUT:-90} "$NCU" --set full --clock-control none -k regex:"$3" \
    --launch-skip 2 --launch-count 1 -f -o /tmp/ncu_$1_$2 \
    python3 benchmarks/flashmla/compare.py --one "$1" "${ARGS[@]}" --calls 4 > /tmp/ncu_$1_$2.log 2>&1
  echo "ncu $1 $2 rc=$?"
  "$NCU" -i /tmp/ncu_$1_$2.ncu-rep --page details > "$OUT/details_$1_$2.txt" 2>&1
  "$NCU" -i /tmp/ncu_$1_$2.ncu-rep --page raw --csv 2>&1 | gzip > "$OUT/raw_$1_$2.csv.gz"
}
ARGS=("$@")
prof ours split "mla_split_wgmma"
prof ours combine "mla_combine"
prof fm split "flash_fwd_splitkv_mla_kernel"
prof fm combine "flash_fwd_mla_combine"
grep -E "^    (Duration|SM Frequency|Elapsed Cycles|SM Active Cycles|L2 Hit Rate|DRAM Throughput|Registers Per)" \
  "$OUT"/details_*.txt | sed 's/  */ /g'
