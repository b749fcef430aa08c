#!/usr/bin/env bash
# The visit prepared at the end of 2026-12-02 (docs/hopper.md step 24, "Next"), in order:
#   1. cluster_pairs.patch: a part's row-tile pairs as 2-CTA clusters, A/B at the cap
#   2. split_adjacent.patch: the mma_sync kernel's GPU tests, then A/B on 16-token pages
#   3. `mlagen bench --flashmla` (quick rows): the "now" columns' first run on a GPU
#   4. pair_profile.sh on the b=64 varlen graph row (ours and FlashMLA's kernels, ncu)
# Trees under .dev beside this one (main = this tree; built by the lead before the visit):
#   clus = main + cluster_pairs.patch, splitadj = main + split_adjacent.patch,
#   fmlib/libflashmla.so = benchmarks/flashmla/build.sh's output.  Run from .dev/main:
#   bash benchmarks/grid_visit.sh          (~400 s; every step writes under $OUT as it goes)
set -u
OUT=${OUT:-$PWD/grid_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
FM_LIB=$(readlink -f "${FM_LIB:-../fmlib/libflashmla.so}")
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
name=$(basename "$PWD")
OUT=$OUT/clus TREES="$name clus" SET=compute ROUNDS=2 POWER=1 ROW_TIMEOUT=100 \
  timeout 200 bash benchmarks/alt_rows.sh > "$OUT/clus.log" 2>&1
echo "1 cluster pairs rc=$? $(el)"; tail -22 "$OUT/clus/alt.md" "$OUT/clus/power.txt" 2>/dev/null
(cd ../splitadj && PYTHONPATH=$PWD timeout 150 python3 -m pytest -q -x -p no:cacheprovider \
  tests/test_hopper_gpu.py > "$OUT/splitadj_pytest.log" 2>&1)
echo "2a split_adjacent GPU tests rc=$? $(el) $(tail -1 "$OUT/splitadj_pytest.log")"
OUT=$OUT/page16 TREES="$name splitadj" SET=page16 ROUNDS=2 ROW_TIMEOUT=120 \
  timeout 300 bash benchmarks/alt_rows.sh > "$OUT/page16.log" 2>&1
echo "2b split_adjacent page16 A/B rc=$? $(el)"; cat "$OUT/page16/alt.md" 2>/dev/null
timeout 150 python3 -m mlagen.cli bench --target hopper --quick --no-progress --flashmla "$FM_LIB" \
  --output "$OUT/bench_now" > "$OUT/bench_now.log" 2>&1
echo "3 bench --flashmla rc=$? $(el)"; grep -E "FlashMLA timed|geomean" "$OUT/bench_now.md" 2>/dev/null
OUT=$OUT/pair FM_LIB=$FM_LIB timeout 240 bash benchmarks/flashmla/pair_profile.sh 64 1 2048 128 \
  --varlen > "$OUT/pair.log" 2>&1
echo "4 pair profile rc=$? $(el)"; tail -20 "$OUT/pair.log"
