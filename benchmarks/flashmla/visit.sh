#!/usr/bin/env bash
# One visit: FlashMLA (prebuilt libflashmla.so, FM_LIB) beside this tree on the same
# tensors: cluster_fit, compare.py (51 eager rows, 8 graph rows, power at the cap), then
# ncu --set full on one split-kernel launch of each on b=128 s_k=8192 h_q=128.
#   FM_LIB=.dev/fmlib/libflashmla.so OUT=... bash benchmarks/flashmla/visit.sh
set -u
OUT=${OUT:-$PWD/fm_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
export FM_LIB=$(readlink -f "${FM_LIB:?libflashmla.so}")
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
[ -n "${NO_FIT:-}" ] || timeout 60 python3 benchmarks/cluster_fit.py 2>&1 | tee "$OUT/cluster_fit.txt"; el
timeout 120 python3 benchmarks/flashmla/compare.py --one ours 128 1 8192 128 --calls 1 || echo "warm-up rc=$?"
el
timeout ${CMP_TIMEOUT:-330} python3 benchmarks/flashmla/compare.py ${QUICK:+--quick} 2>&1 | tee "$OUT/compare.md"; el
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() {  # name, kernel regex, which
  timeout ${NCU_TIMEOUT:-90} "$NCU" --set full --import-source yes --clock-control none \
    -k regex:"$2" --launch-skip 2 --launch-count 1 -f -o /tmp/ncu_$1 \
    python3 benchmarks/flashmla/compare.py --one "$3" 128 1 8192 128 --calls 4 > /tmp/ncu_$1.log 2>&1
  echo "ncu $1 rc=$? $(el)"; tail -3 /tmp/ncu_$1.log
  "$NCU" -i /tmp/ncu_$1.ncu-rep --page details > "$OUT/details_$1.txt" 2>&1
  "$NCU" -i /tmp/ncu_$1.ncu-rep --page raw --csv 2>&1 | gzip > "$OUT/raw_$1.csv.gz"
}
[ -n "${NO_NCU:-}" ] || { prof ours mla_split_wgmma_kernel ours; prof fm flash_fwd_splitkv_mla_kernel fm; }
grep -E "^  [A-Za-z].*(Duration|SM Frequency|Elapsed Cycles|SM Active Cycles|Executed Ipc A|Registers Per)" "$OUT"/details_*.txt | head -20
el
