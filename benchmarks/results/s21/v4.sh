#!/usr/bin/env bash
# s21 visit 4: is PDL what slows our decode after a GEMM on the s_q = 2 rows (v3: +42-65 us
# a call in bench.Step's layers, FlashMLA ~0)?  Trees main and nopdl (the split kernels
# launched without the programmatic-serialization attribute; the combine keeps it), three
# rounds of benchmarks/graph_layers.py in the modes layers, gemm, gemmonly; then the
# kernels torch.mm runs for the GEMM of each row's shape.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/v4"
export MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
T0=$(date +%s)
TREES="main nopdl"
ROWS="128,2,4096,64 128,2,8192,128 128,1,4096,128 16,2,2048,64 32,1,1024,128 64,1,2048,128,v"
for t in $TREES; do
  (cd .dev/$t && MLAGEN_CACHE_DIR=/tmp/mc_$t PYTHONPATH=$PWD python3 -c "
from mlagen.backends.hopper import bench
for s in [(16,2,2048,64,False)]: bench.Caller(*s)()
") > "$OUT/v4/build_$t.log" 2>&1
  echo "build $t rc=$? $(( $(date +%s) - T0 )) s"
done
for r in 1 2 3; do
  for t in $TREES; do
    (( $(date +%s) - T0 > 420 )) && break 2
    (cd .dev/$t && MLAGEN_CACHE_DIR=/tmp/mc_$t PYTHONPATH=$PWD timeout 100 python3 \
      benchmarks/graph_layers.py "$OUT/v4/${t}_r$r.json" --modes layers,gemm,gemmonly \
      --rows $ROWS) > "$OUT/v4/${t}_r$r.log" 2>&1
    echo "round $r $t rc=$? $(( $(date +%s) - T0 )) s"
  done
done
python3 - <<'PY' > "$OUT/v4/gemm_kernels.txt" 2>&1
import torch
from torch.profiler import profile, ProfilerActivity
for m in (16, 128, 256):
    x = torch.randn(m, 7168, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(7168, 4096, dtype=torch.bfloat16, device="cuda")
    torch.mm(x, w); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        torch.mm(x, w); torch.cuda.synchronize()
    print(m, [(e.name[:90], round(e.device_time, 1)) for e in p.events() if e.device_time > 0])
PY
cat "$OUT/v4/gemm_kernels.txt"
python3 - "$OUT/v4" $TREES <<'PY'
import json, statistics, sys, glob
d, trees = sys.argv[1], sys.argv[2:]
def load(t):
    acc = {}
    for f in sorted(glob.glob(f"{d}/{t}_r*.json")):
        for r in json.load(open(f)):
            k = (r["b"], r["s_q"], r["sk"], r["h_q"], r["varlen"])
            r["step"] = r["gemm"] - r["gemmonly"]
            for m in ("layers", "gemm", "gemmonly", "step"):
                acc.setdefault((k, m), []).append(r[m])
    return acc
res = {t: load(t) for t in trees}
print("| row | mode | " + " | ".join(trees) + " | main/nopdl | rounds (main; nopdl) |")
print("|---|---|---:|---:|---:|---|")
for (k, m), v in res["main"].items():
    w = res["nopdl"].get((k, m))
    if not w: continue
    lab = " ".join(map(str, k[:4])) + (" varlen" if k[4] else "")
    a, b = statistics.median(v), statistics.median(w)
    print(f"| {lab} | {m} | {a:.1f} | {b:.1f} | {a / b:.3f} | {', '.join(f'{x:.0f}' for x in v)}; {', '.join(f'{x:.0f}' for x in w)} |")
PY
