#!/usr/bin/env bash
# One GPU visit for the few-rows wgmma kernel with two consumer warpgroups (mla_wgmma_rows.cuh,
# warps = 8; branch rows2): build, small NaN-poisoned correctness (1 and 2 consumer WGs),
# the s_q*h_q = 16 and 32 anchor rows timed with 1 vs 2 consumer WGs in one process,
# compute-sanitizer (memcheck, racecheck, synccheck) on the two-WG kernel, the path's GPU
# tests; the short table last.  Every step is time-boxed and the whole visit ends by
# DEADLINE_S (235 s) after it starts.  Timing comes before the sanitizer and the tests so
# that the measurement survives if the time runs out (each timed output is checked against
# the reference first; `small` gates it).  Usage (repository root on the GPU machine):
#   COMMIT=<sha> bash benchmarks/rows2_visit.sh
#   STEPS="build small time sanitize tests"  (default: all, in that order)
set -u
OUT=${OUT:-$PWD/rows2_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export MLAGEN_CACHE_DIR=${MLAGEN_CACHE_DIR:-/tmp/mlagen-cache}
export MLAGEN_BUILD_JOBS=${MLAGEN_BUILD_JOBS:-16}
STEPS=${STEPS:-build small time sanitize tests}
T0=$(date +%s); END=$((T0 + ${DEADLINE_S:-235}))
el() { echo "$(($(date +%s) - T0)) s"; }
# box N: N seconds, or what is left before the deadline (at least 1)
box() { local left=$((END - $(date +%s) - 2)); [ "$left" -lt "$1" ] && echo $((left > 1 ? left : 1)) || echo "$1"; }
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; nvcc --version | tail -1;
  echo "commit ${COMMIT:-?}"; } > "$OUT/env.txt" 2>&1; cat "$OUT/env.txt"
if has build; then
  # the timed and the small variants first (the pool starts them in this order), then the
  # faulted ones the tests use; whatever is not built in time is built by the step needing it
  timeout $(box 60) python3 - > "$OUT/build.log" 2>&1 <<'PY'
import time
from concurrent.futures import ThreadPoolExecutor
from mlagen.jit import build
from mlagen.backends.hopper import render, defaults
from mlagen.schedule.records import Schedule
w = dict(target="hopper", mainloop="wgmma", block_kv=64, buffers=2)
S = lambda r, wp, d="bf16": defaults.canonical(Schedule.build(**w, rows_per_tile=r, warps=wp, dtype=d))
s = [S(r, wp) for wp in (8, 4) for r in (16, 32)]
s += [S(r, wp, "fp16") for wp in (8, 4) for r in (16, 32)]
s += [S(r, 8).with_fault(f) for r, f in ((16, "causal_off_by_one"), (16, "skip_partial_page"),
                                          (32, "skip_partial_page"), (32, "wrong_scale"),
                                          (16, "wrong_scale"))]
t = time.time()
with ThreadPoolExecutor(16) as ex:
    for a in ex.map(lambda x: build(render(x)), {x.variant_name(): x for x in s}.values()):
        print(a.path, round(a.seconds, 1), flush=True)
print("built in", round(time.time() - t, 1), "s")
PY
  echo "build rc=$? $(el)"; tail -2 "$OUT/build.log"
fi
SMALL_OK=0
if has small; then
  timeout $(box 30) python3 benchmarks/rows_bench.py small --warps 8,4 > "$OUT/small.log" 2>&1
  rc=$?; echo "small rc=$rc $(el)"; tail -6 "$OUT/small.log"; [ $rc = 0 ] && SMALL_OK=1
fi
if has time && [ $SMALL_OK = 1 ]; then
  # no new row past --budget (the table is printed within the time box)
  timeout $(box ${TIME_TIMEOUT:-95}) python3 benchmarks/rows_bench.py time --warps 4,8 \
    --budget ${TIME_BUDGET:-70} --out "$OUT/time.json" > "$OUT/time.log" 2>&1
  echo "time rc=$? $(el)"
fi
if has sanitize && [ $SMALL_OK = 1 ]; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  for tool in ${TOOLS:-memcheck racecheck synccheck}; do
    timeout $(box 22) "$CS" --tool $tool --error-exitcode 9 python3 benchmarks/rows_bench.py small \
      --warps 8 --quick > "$OUT/sanitize_$tool.log" 2>&1
    echo "sanitize $tool rc=$? $(el)"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|small" "$OUT/sanitize_$tool.log" | head -3
  done
fi
if has tests && [ $SMALL_OK = 1 ]; then
  # the two-WG cases first (-x: stop at the first failure), then the faults suite's w8 example
  timeout $(box 60) python3 -m pytest -q -x -p no:cacheprovider tests/test_hopper_wgmma_gpu.py \
    -k "rows and (w8 or two_consumers)" > "$OUT/pytest_rows_w8.log" 2>&1
  echo "pytest rows w8 rc=$? $(el)"; tail -3 "$OUT/pytest_rows_w8.log"
  timeout $(box 40) python3 -m pytest -q -p no:cacheprovider tests/test_hopper_faults.py \
    -k "r16_w8" > "$OUT/pytest_faults_w8.log" 2>&1
  echo "pytest faults w8 rc=$? $(el)"; tail -3 "$OUT/pytest_faults_w8.log"
  timeout $(box 60) python3 -m pytest -q -p no:cacheprovider tests/test_hopper_wgmma_gpu.py \
    -k "rows_hypothesis" > "$OUT/pytest_rows_hyp.log" 2>&1
  echo "pytest rows hypothesis rc=$? $(el)"; tail -3 "$OUT/pytest_rows_hyp.log"
fi
echo "==== timing (eager ms, GB/s, ratio to the best anchor; table: per configuration) $(el)"
cat "$OUT/time.log" 2>/dev/null
