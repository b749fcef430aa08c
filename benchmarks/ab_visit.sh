#!/usr/bin/env bash
# One GPU visit: this tree (B) against a base tree (A, in ../base): racecheck micro kernels,
# builds, NaN-poisoned small cases on B, the A/B timing of the bench of record's compute rows
# and graph rows (benchmarks/ab_rows.py, one process per tree), B's GPU tests of the wgmma
# paths, memcheck + synccheck on B; the table last.  Time-boxed steps, logs under $OUT.
#   COMMIT=<sha> BASE=<sha> bash benchmarks/ab_visit.sh
# EXTRA="x y": also time the sibling trees ../x, ../y (carried as .dev/x, .dev/y) after B, in
# the same visit; the table then has a column pair per tree.  SKIP_TESTS=1 leaves out the GPU
# tests and sanitizers (three trees' timing alone is ~6 min; run the tests in a second call).
# HOST=1: benchmarks/hopper_host_breakdown.py in A and B; BENCH=1: the bench of record on B.
# PROBE=1: the split kernel's fixed cost per CTA (hopper_split_probe.py --overhead) in A and B.
set -u
OUT=${OUT:-$PWD/ab_out}; mkdir -p "$OUT"
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
B=$PWD; A=$(cd ../base && pwd)
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "B ${COMMIT:-?} A ${BASE:-?}"; } | tee "$OUT/env.txt"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
{ nvcc -gencode=arch=compute_90a,code=sm_90a -lineinfo -o /tmp/rc benchmarks/racecheck_namedbar.cu
  for m in ctrl named arrive wg3 racy; do /tmp/rc $m
    timeout 30 "$CS" --tool racecheck /tmp/rc $m 2>&1 | grep -E "RACECHECK SUMMARY" | sed "s/^/racecheck $m: /"; done
} > "$OUT/racecheck_micro.log" 2>&1
cat "$OUT/racecheck_micro.log"; echo "racecheck micro $(el)"
build() { PYTHONPATH=$1 timeout 90 python3 -c "
from concurrent.futures import ThreadPoolExecutor
from mlagen.jit import build
from mlagen.backends.hopper import render, defaults
s = [defaults.default_schedule(r, d) for r in (16, 32, 64) for d in ('bf16', 'fp16')]
with ThreadPoolExecutor(8) as ex: list(ex.map(lambda x: build(render(x)), {x.variant_name(): x for x in s}.values()))
print('built', $2)"; }
EXTRA=${EXTRA:-}
(build $A '"A"' & build $B '"B"' & for t in $EXTRA; do build $(cd ../$t && pwd) "'$t'" & done
 wait) > "$OUT/build.log" 2>&1; echo "build $(el)"; tail -2 "$OUT/build.log"
export PYTHONPATH=$B
{ timeout 40 python3 benchmarks/wgmma_bench.py small; timeout 40 python3 benchmarks/rows_bench.py small --warps 4,8 --quick; } > "$OUT/small.log" 2>&1
echo "small rc=$? $(el)"; tail -4 "$OUT/small.log"
(cd $A && PYTHONPATH=$A timeout 100 python3 $B/benchmarks/ab_rows.py "$OUT/A.json") > "$OUT/time_A.log" 2>&1; echo "time A $(el)"
timeout 100 python3 benchmarks/ab_rows.py "$OUT/B.json" > "$OUT/time_B.log" 2>&1; echo "time B $(el)"
for t in $EXTRA; do
  (cd ../$t && PYTHONPATH=$PWD timeout 100 python3 $B/benchmarks/ab_rows.py "$OUT/$t.json") \
    > "$OUT/time_$t.log" 2>&1; echo "time $t $(el)"
done
if [[ ${SKIP_TESTS:-0} != 1 ]]; then
timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -x -p no:cacheprovider tests/test_hopper_wgmma_gpu.py \
  tests/test_hopper_gpu.py -k "test_cases or wgmma or rows or cuda_graph or bad_input or bad_page or out_pair" \
  > "$OUT/pytest_gpu.log" 2>&1
echo "gpu tests rc=$? $(el)"; tail -2 "$OUT/pytest_gpu.log"
for tool in memcheck synccheck; do
  timeout 40 "$CS" --tool $tool --error-exitcode 9 python3 benchmarks/wgmma_bench.py small > "$OUT/$tool.log" 2>&1
  echo "$tool rc=$? $(el): $(grep -E 'ERROR SUMMARY' "$OUT/$tool.log" | head -1)"
done
fi
if [[ ${HOST:-0} == 1 ]]; then   # host time of one eager call, each tree in its own process
  for t in $A $B; do (cd $t && PYTHONPATH=$t timeout 60 python3 benchmarks/hopper_host_breakdown.py) \
    > "$OUT/host_$(basename $t).log" 2>&1; echo "host $(basename $t) $(el):" \
    $(grep -E "^(call x30|call x300|signature|2 x|ctypes|plan.run)" "$OUT/host_$(basename $t).log" | tr '\n' ';')
  done
fi
if [[ ${PROBE:-0} == 1 ]]; then   # split kernel us against blocks per CTA, each tree
  for t in $A $B; do (cd $t && PYTHONPATH=$t timeout 90 python3 $B/benchmarks/hopper_split_probe.py \
    --overhead --out "$OUT/probe_$(basename $t).json") > "$OUT/probe_$(basename $t).log" 2>&1
    echo "probe $(basename $t) $(el)"; grep -E '^\| (partials|direct)' "$OUT/probe_$(basename $t).log"
  done
fi
if [[ ${BENCH:-0} == 1 ]]; then   # the bench of record on B
  MLAGEN_COMMIT=${COMMIT:-} timeout 110 python3 -m mlagen.cli bench --target hopper --no-progress \
    --output "$OUT/hopper_bench" > "$OUT/bench.log" 2>&1
  echo "bench rc=$? $(el)"; grep -iE "geomean|host" "$OUT/hopper_bench.md" 2>/dev/null | head -4
fi
python3 benchmarks/ab_rows.py --compare "$OUT/A.json" "$OUT/B.json" \
  $(for t in $EXTRA; do echo "$OUT/$t.json"; done) | tee "$OUT/ab.md"
