#!/usr/bin/env bash
# A/B of the split -> combine launch on the graph rows, in one visit: A = programmatic
# dependent launch with the trigger at the split kernel's start (the tree as committed),
# B = PDL with the implicit trigger (each split CTA's exit), C = plain stream order.
# Each stage edits the headers of this disposable copy (the cache key follows the headers).
# Also the host-time breakdown.  Logs under $OUT.
set -u
OUT=${OUT:-$PWD/hopper_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache
timeout 30 python3 benchmarks/hopper_host_breakdown.py > "$OUT/host_breakdown.log" 2>&1
cat "$OUT/host_breakdown.log"
stage() {
  python3 - "$1" <<'PY'
import sys, time
from concurrent.futures import ThreadPoolExecutor
from mlagen.jit import build
from mlagen.backends.hopper import render, defaults, bench
with ThreadPoolExecutor(6) as ex:
    list(ex.map(lambda s: build(render(s)), [defaults.default_schedule(r) for r in (16, 32, 64)]))
rows = [r for r in bench.plan_rows() if r.kind == "graph"]
for r in rows:
    bench.measure_row(r, modes=("graph",))
    print(sys.argv[1], r.label(), r.check, f"graph {r.graph_ms*1e3:.1f} us (FlashMLA {r.flashmla_graph_us})", flush=True)
PY
}
stage A 2>&1 | tee "$OUT/ab.log" | grep -v Warn
sed -i 's/^    pdl_launch_dependents();.*$//' templates/hopper/include/mla_split.cuh
stage B 2>&1 | tee -a "$OUT/ab.log" | grep -v Warn
sed -i 's/programmaticStreamSerializationAllowed = 1/programmaticStreamSerializationAllowed = 0/' templates/hopper/include/mla_combine.cuh
stage C 2>&1 | tee -a "$OUT/ab.log" | grep -v Warn
