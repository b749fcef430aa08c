#!/usr/bin/env bash
# One GPU visit for the wgmma main loop: build, a small correctness case, compute-sanitizer
# (memcheck, racecheck, synccheck) on it, the anchor's compute-bound rows timed beside the
# mma_sync kernel and the anchor, then the GPU tests of the wgmma path; a short table last.
# Usage (repository root on the GPU machine): bash benchmarks/wgmma_visit.sh
#   STEPS="build small time sanitize tests"  (default: all, in that order)
set -u
OUT=${OUT:-$PWD/wgmma_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export MLAGEN_CACHE_DIR=${MLAGEN_CACHE_DIR:-/tmp/mlagen-cache}
export MLAGEN_BUILD_JOBS=${MLAGEN_BUILD_JOBS:-16}
STEPS=${STEPS:-build small time sanitize tests}
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
w = dict(target="hopper", mainloop="wgmma", rows_per_tile=64, block_kv=64, buffers=2, warps=8)
s = [defaults.canonical(Schedule.build(**w, dtype=d)) for d in ("bf16", "fp16")]
s += [defaults.canonical(Schedule.build(**w).with_fault(f))
      for f in ("causal_off_by_one", "skip_partial_page")]
s += [defaults.default_schedule(r, d) for r in (16, 32, 64) for d in ("bf16", "fp16")]
pass
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
  timeout 120 python3 benchmarks/wgmma_bench.py small > "$OUT/small.log" 2>&1
  rc=$?; echo "small rc=$rc"; tail -5 "$OUT/small.log"; [ $rc = 0 ] && SMALL_OK=1
fi
if has time && [ $SMALL_OK = 1 ]; then
  timeout 200 python3 benchmarks/wgmma_bench.py time --out "$OUT/time.json" > "$OUT/time.log" 2>&1
  echo "time rc=$?"
fi
if has sanitize; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  for tool in ${TOOLS:-memcheck racecheck synccheck}; do
    timeout 150 "$CS" --tool $tool --error-exitcode 9 python3 benchmarks/wgmma_bench.py small \
      > "$OUT/sanitize_$tool.log" 2>&1
    echo "sanitize $tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error" "$OUT/sanitize_$tool.log" | head -3
  done
fi
if has tests; then
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -x -p no:cacheprovider tests/test_hopper_wgmma_gpu.py \
    > "$OUT/pytest_wgmma.log" 2>&1
  echo "pytest wgmma rc=$?"; tail -6 "$OUT/pytest_wgmma.log"
  timeout ${TEST_TIMEOUT2:-200} python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py -k "test_cases" \
    > "$OUT/pytest_cases.log" 2>&1
  echo "pytest cases (mma_sync + wgmma defaults) rc=$?"; tail -4 "$OUT/pytest_cases.log"
fi
[ -f "$OUT/time.log" ] && tail -8 "$OUT/time.log"
