#!/usr/bin/env bash
# s21 visit 1: K evict-first (benchmarks/patches/k_evict_first.patch) against main on the graph
# rows, each timed on one replayed K (the anchor's method) and on 20 distinct K caches (a
# serving step's layers): benchmarks/graph_layers.py, trees alternating over 2 rounds.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/v1"
export MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
for t in main ef; do
  (cd .dev/$t && MLAGEN_CACHE_DIR=/tmp/mc_$t PYTHONPATH=$PWD python3 -c "
from mlagen.backends.hopper import bench
for s in [(16,2,2048,64,False),(8,1,8192,16,True)]: bench.Caller(*s)()
") > "$OUT/v1/build_$t.log" 2>&1
  echo "build $t rc=$? $(( $(date +%s) - T0 )) s"
done
for r in 1 2; do
  for t in main ef; do
    (cd .dev/$t && MLAGEN_CACHE_DIR=/tmp/mc_$t PYTHONPATH=$PWD timeout 150 python3 \
      benchmarks/graph_layers.py "$OUT/v1/${t}_r$r.json") > "$OUT/v1/${t}_r$r.log" 2>&1
    echo "round $r $t rc=$? $(( $(date +%s) - T0 )) s"
  done
done
python3 - "$OUT/v1" <<'PY'
import json, statistics, sys, glob
d = sys.argv[1]
def load(t):
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{d}/{t}_r*.json"))]
    out = {}
    for run in runs:
        for r in run:
            k = (r["b"], r["s_q"], r["sk"], r["h_q"], r["varlen"])
            out.setdefault(k, {"same": [], "distinct": [], "check": r["check"], "k": r["k_mib"]})
            out[k]["same"].append(r["same_us"]); out[k]["distinct"].append(r["distinct_us"])
    return out
m, e = load("main"), load("ef")
print("| row | K MiB | main same | ef same | main/ef | main distinct | ef distinct | main/ef | check |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
for k in m:
    if k not in e: continue
    ms, es = statistics.median(m[k]["same"]), statistics.median(e[k]["same"])
    md, ed = statistics.median(m[k]["distinct"]), statistics.median(e[k]["distinct"])
    lab = " ".join(map(str, k[:4])) + (" varlen" if k[4] else "")
    print(f"| {lab} | {m[k]['k']:.0f} | {ms:.1f} | {es:.1f} | {ms/es:.3f} | {md:.1f} | {ed:.1f} | {md/ed:.3f} | {m[k]['check']}/{e[k]['check']} |")
PY
