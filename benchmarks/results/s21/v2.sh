#!/usr/bin/env bash
# s21 visit 2: K's L2 policy under five L2 states (benchmarks/graph_layers.py), trees in turn
# over 2 rounds: main, ef (k_evict_first.patch), en (the same cache-hinted copy with an
# evict_normal policy: the hint's own cost), ef50 (evict_first on half the lines).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/v2"
export MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
T0=$(date +%s)
TREES="main ef en ef50"
for t in $TREES; do
  (cd .dev/$t && MLAGEN_CACHE_DIR=/tmp/mc_$t PYTHONPATH=$PWD python3 -c "
from mlagen.backends.hopper import bench
for s in [(16,2,2048,64,False),(8,1,8192,16,True)]: bench.Caller(*s)()
") > "$OUT/v2/build_$t.log" 2>&1
  echo "build $t rc=$? $(( $(date +%s) - T0 )) s"
done
for r in 1 2; do
  for t in $TREES; do
    (( $(date +%s) - T0 > 470 )) && break 2
    (cd .dev/$t && export MLAGEN_CACHE_DIR=/tmp/mc_$t PYTHONPATH=$PWD &&
     timeout 100 python3 benchmarks/graph_layers.py "$OUT/v2/${t}_g_r$r.json" --modes same,layers,gemm &&
     timeout 100 python3 benchmarks/graph_layers.py "$OUT/v2/${t}_a_r$r.json" --modes flush,b2b,layers \
       --rows 128,1,8192,32 128,1,8192,64 128,1,8192,16 128,1,8192,128) > "$OUT/v2/${t}_r$r.log" 2>&1
    echo "round $r $t rc=$? $(( $(date +%s) - T0 )) s"
  done
done
python3 - "$OUT/v2" $TREES <<'PY'
import json, statistics, sys, glob
d, trees = sys.argv[1], sys.argv[2:]
def load(t):
    out = {}
    for f in sorted(glob.glob(f"{d}/{t}_*_r*.json")):
        for r in json.load(open(f)):
            k = (r["b"], r["s_q"], r["sk"], r["h_q"], r["varlen"])
            for m in ("same", "layers", "gemm", "flush", "b2b"):
                if m in r: out.setdefault((k, m), []).append(r[m])
    return {k: statistics.median(v) for k, v in out.items()}
res = {t: load(t) for t in trees}
print("| row | mode | " + " | ".join(trees) + " | " + " | ".join(f"main/{t}" for t in trees[1:]) + " |")
print("|---|---|" + "---:|" * (2 * len(trees) - 1))
for (k, m), v in res["main"].items():
    lab = " ".join(map(str, k[:4])) + (" varlen" if k[4] else "")
    cells = [f"{res[t].get((k, m), float('nan')):.1f}" for t in trees]
    rat = [f"{v / res[t][(k, m)]:.3f}" if (k, m) in res[t] else "-" for t in trees[1:]]
    print(f"| {lab} | {m} | " + " | ".join(cells) + " | " + " | ".join(rat) + " |")
PY
