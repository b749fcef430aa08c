#!/usr/bin/env bash
# One GPU visit for the few-rows wgmma kernel (mla_wgmma_rows.cuh): build, small correctness,
# the s_q*h_q <= 32 anchor rows timed beside the current default, compute-sanitizer, GPU
# tests of the path.  Usage (repository root on the GPU machine): bash benchmarks/rows_visit.sh
#   STEPS="build small time bench sanitize tests"  (default: all, in that order)
set -u
OUT=${OUT:-$PWD/rows_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export MLAGEN_CACHE_DIR=${MLAGEN_CACHE_DIR:-/tmp/mlagen-cache}
export MLAGEN_BUILD_JOBS=${MLAGEN_BUILD_JOBS:-16}
STEPS=${STEPS:-build small time bench sanitize tests}
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; nvcc --version | tail -1;
  echo "commit ${COMMIT:-?}"; } > "$OUT/env.txt" 2>&1; cat "$OUT/env.txt"
if has build; then
  timeout 200 python3 - > "$OUT/build.log" 2>&1 <<'PY'
import time
from concurrent.futures import ThreadPoolExecutor
from mlagen.jit import build
from mlagen.backends.hopper import render, defaults
from mlagen.schedule.records import Schedule
w = dict(target="hopper", mainloop="wgmma", block_kv=64, buffers=2, warps=4)
s = [defaults.canonical(Schedule.build(**w, rows_per_tile=r, dtype=d))
     for r in (16, 32) for d in ("bf16", "fp16")]
s += [defaults.canonical(Schedule.build(**w, rows_per_tile=r).with_fault(f))
      for r, f in ((16, "causal_off_by_one"), (32, "skip_partial_page"), (16, "wrong_scale"))]
s += [defaults.default_schedule(r, d) for r in (16, 32) for d in ("bf16",)]
t = time.time()
with ThreadPoolExecutor(12) as ex:
    for a in ex.map(lambda x: build(render(x)), {x.variant_name(): x for x in s}.values()):
        print(a.path, round(a.seconds, 1))
print("built in", round(time.time() - t, 1), "s")
PY
  echo "build rc=$?"; tail -3 "$OUT/build.log"
fi
SMALL_OK=0
if has small; then
  timeout 90 python3 benchmarks/rows_bench.py small > "$OUT/small.log" 2>&1
  rc=$?; echo "small rc=$rc"; tail -15 "$OUT/small.log"; [ $rc = 0 ] && SMALL_OK=1
fi
if has time && [ $SMALL_OK = 1 ]; then
  timeout ${TIME_TIMEOUT:-150} python3 benchmarks/rows_bench.py time --out "$OUT/time.json" > "$OUT/time.log" 2>&1
  echo "time rc=$?"
fi
if has bench && [ $SMALL_OK = 1 ]; then
  # the benchmark of record with the few-rows kernel as the 16- and 32-row classes' default
  MLAGEN_COMMIT=${COMMIT:-} MLAGEN_HOPPER_MAINLOOP='{"16": "wgmma", "32": "wgmma"}' \
    MLAGEN_HOPPER_WGMMA_KNOBS='{"16": [16, 64, 2, 4], "32": [32, 64, 2, 4]}' \
    timeout ${BENCH_TIMEOUT:-150} python3 -m mlagen.cli bench --target hopper --no-progress \
    --output "$OUT/bench_rows" > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"; grep -E "geomean|host" "$OUT/bench.log" | tail -2
fi
if has sanitize && [ $SMALL_OK = 1 ]; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  for tool in ${TOOLS:-memcheck racecheck synccheck}; do
    timeout 120 "$CS" --tool $tool --error-exitcode 9 python3 benchmarks/rows_bench.py small \
      > "$OUT/sanitize_$tool.log" 2>&1
    echo "sanitize $tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error" "$OUT/sanitize_$tool.log" | head -3
  done
fi
if has tests && [ $SMALL_OK = 1 ]; then
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -x -p no:cacheprovider tests/test_hopper_wgmma_gpu.py -k "rows" \
    > "$OUT/pytest_rows.log" 2>&1
  echo "pytest rows rc=$?"; tail -4 "$OUT/pytest_rows.log"
  timeout ${TEST_TIMEOUT2:-200} python3 -m pytest -q -p no:cacheprovider tests/test_hopper_faults.py -k "${FAULTS_K:-wgmma_r}" \
    > "$OUT/pytest_faults.log" 2>&1
  echo "pytest faults rc=$?"; tail -4 "$OUT/pytest_faults.log"
  MLAGEN_HOPPER_MAINLOOP='{"16": "wgmma", "32": "wgmma", "64": "wgmma"}' \
    MLAGEN_HOPPER_WGMMA_KNOBS='{"32": [32, 64, 2, 4]}' \
    timeout ${TEST_TIMEOUT3:-150} python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py -k "test_cases and wgmma" \
    > "$OUT/pytest_cases.log" 2>&1
  echo "pytest cases rc=$?"; tail -4 "$OUT/pytest_cases.log"
fi
echo "==== timing (eager ms, GB/s, ratio to the best anchor)"
cat "$OUT/time.log" 2>/dev/null
