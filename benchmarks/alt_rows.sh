#!/usr/bin/env bash
# Trees timed in turn, ROUNDS times over, on one set of rows (benchmarks/ab_rows.py, one process
# per tree and round), then the table of medians: for differences of a few per cent, which
# one pass per tree (ab_visit.sh) cannot separate from the drift within a visit.
#   TREES="base equal" SET=graph ROUNDS=3 bash benchmarks/alt_rows.sh   (trees are ../NAME)
# POWER=1: then each tree in turn at the power cap on one compute row (power_trees.py: ms, SM
# clock, watts, work per GHz), twice: the compute rows run at the ~692 W cap, where a kernel
# that does more per clock gets a lower clock (benchmarks/results/hopper_power_bound_h200.md)
set -u
OUT=${OUT:-$PWD/alt_out}; mkdir -p "$OUT"
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
HERE=$(cd "$(dirname "$0")" && pwd)
T0=$(date +%s)
# into tree ../$1; a tree may carry ab.env (e.g. MLAGEN_HOPPER_TUNE_TABLE=$PWD/tt.json): the same
# code, other defaults
in_tree() { cd "../$1" && { [[ ! -f ab.env ]] || { set -a; . ./ab.env; set +a; }; }; }
for r in $(seq 1 "${ROUNDS:-3}"); do
  for t in $TREES; do
    (in_tree "$t" && PYTHONPATH=$PWD timeout "${ROW_TIMEOUT:-100}" python3 "$HERE/ab_rows.py" \
      "$OUT/${t}_r$r.json" --set "${SET:-graph}") > "$OUT/${t}_r$r.log" 2>&1
    echo "round $r $t rc=$? $(($(date +%s) - T0)) s"
  done
done
args=()
for t in $TREES; do args+=("$(ls "$OUT/${t}"_r*.json | paste -sd,)"); done
python3 "$HERE/ab_rows.py" --compare "${args[@]}" | tee "$OUT/alt.md"
if [[ ${POWER:-0} == 1 ]]; then
  for r in 1 2; do
    for t in $TREES; do
      (in_tree "$t" && PYTHONPATH=$PWD timeout 60 python3 "$HERE/power_trees.py" "$PWD" \
        ${POWER_ROW:-128 1 8192 128} 2>&1 | tail -1) | tee -a "$OUT/power.txt"
    done
  done
fi
