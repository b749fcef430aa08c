#!/usr/bin/env bash
# Trees timed in turn, ROUNDS times over, on one set of rows (benchmarks/ab_rows.py, one process
# per tree and round), then the table of medians: for differences of a few per cent, which
# one pass per tree (ab_visit.sh) cannot separate from the drift within a visit.
#   TREES="base equal" SET=graph ROUNDS=3 bash benchmarks/alt_rows.sh   (trees are ../NAME)
set -u
OUT=${OUT:-$PWD/alt_out}; mkdir -p "$OUT"
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
HERE=$(cd "$(dirname "$0")" && pwd)
T0=$(date +%s)
for r in $(seq 1 "${ROUNDS:-3}"); do
  for t in $TREES; do
    (cd "../$t" && PYTHONPATH=$PWD timeout "${ROW_TIMEOUT:-100}" python3 "$HERE/ab_rows.py" \
      "$OUT/${t}_r$r.json" --set "${SET:-graph}") > "$OUT/${t}_r$r.log" 2>&1
    echo "round $r $t rc=$? $(($(date +%s) - T0)) s"
  done
done
args=()
for t in $TREES; do args+=("$(ls "$OUT/${t}"_r*.json | paste -sd,)"); done
python3 "$HERE/ab_rows.py" --compare "${args[@]}" | tee "$OUT/alt.md"
