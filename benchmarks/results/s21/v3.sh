#!/usr/bin/env bash
# s21 visit 3: mlagen (main) and FlashMLA (9edee0c, benchmarks/flashmla/build.sh, in
# .dev/fmlib) on the same tensors under five L2 states (benchmarks/graph_layers.py
# --flashmla): the graph rows, and three compute anchor rows; 2 rounds.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/v3"
export MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0 MLAGEN_CACHE_DIR=/tmp/mc_main
FM=$PWD/.dev/fmlib/libflashmla.so
T0=$(date +%s)
cd .dev/main
export PYTHONPATH=$PWD
python3 -c "
from mlagen.backends.hopper import bench
for s in [(16,2,2048,64,False),(8,1,8192,16,True)]: bench.Caller(*s)()
" > "$OUT/v3/build.log" 2>&1
echo "build rc=$? $(( $(date +%s) - T0 )) s"
for r in 1 2; do
  timeout 200 python3 benchmarks/graph_layers.py "$OUT/v3/g_r$r.json" --flashmla "$FM" \
    --modes same,layers,gemm,gemmonly,b2b,flush > "$OUT/v3/g_r$r.log" 2>&1
  echo "round $r graph rows rc=$? $(( $(date +%s) - T0 )) s"
  timeout 120 python3 benchmarks/graph_layers.py "$OUT/v3/a_r$r.json" --flashmla "$FM" \
    --modes layers,gemm,b2b,flush --rows 128,1,4096,128 128,2,4096,64 128,2,8192,128 \
    > "$OUT/v3/a_r$r.log" 2>&1
  echo "round $r anchor rows rc=$? $(( $(date +%s) - T0 )) s"
done
python3 - "$OUT/v3" <<'PY'
import json, statistics, sys, glob
d = sys.argv[1]
acc = {}
for f in sorted(glob.glob(f"{d}/*_r*.json")):
    for r in json.load(open(f)):
        k = (r["b"], r["s_q"], r["sk"], r["h_q"], r["varlen"])
        if "gemmonly" in r and "gemm" in r and "fm_gemm" in r:
            r["step"], r["fm_step"] = r["gemm"] - r["gemmonly"], r["fm_gemm"] - r["gemmonly"]
        for m in ("same", "layers", "gemm", "step", "b2b", "flush"):
            if m in r and "fm_" + m in r:
                acc.setdefault((k, m), ([], []))
                acc[(k, m)][0].append(r[m]); acc[(k, m)][1].append(r["fm_" + m])
print("| row | mode | mlagen us | FlashMLA us | FlashMLA / mlagen |")
print("|---|---|---:|---:|---:|")
for (k, m), (a, b) in acc.items():
    lab = " ".join(map(str, k[:4])) + (" varlen" if k[4] else "")
    x, y = statistics.median(a), statistics.median(b)
    print(f"| {lab} | {m} | {x:.1f} | {y:.1f} | {y / x:.3f} |")
PY
