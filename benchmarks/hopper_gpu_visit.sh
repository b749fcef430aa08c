#!/usr/bin/env bash
# One GPU visit: the cuda tests, then the sweep.  Logs under $OUT (or ./hopper_out).
# Usage (from the repository root on the GPU machine): bash benchmarks/hopper_gpu_visit.sh
set -u
OUT=${OUT:-$PWD/hopper_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export MLAGEN_CACHE_DIR=${MLAGEN_CACHE_DIR:-/tmp/mlagen-cache}
export MLAGEN_BUILD_JOBS=${MLAGEN_BUILD_JOBS:-16}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nvcc --version | tail -1;
  python3 -c 'import torch; print("torch", torch.__version__)'; echo "commit ${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
# build the default variants first (parallel), so test time is test time
python3 - <<'PY' > "$OUT/build.log" 2>&1
import time
from concurrent.futures import ThreadPoolExecutor
from mlagen.build import build
from mlagen.backends.hopper import render, defaults
t = time.time()
scheds = [defaults.default_schedule(r, d) for r in (16, 32, 64) for d in ("bf16", "fp16")]
with ThreadPoolExecutor(6) as ex:
    for a in ex.map(lambda s: build(render(s)), scheds):
        print(a.path, round(a.seconds, 1))
print("built in", round(time.time() - t, 1), "s")
PY
tail -2 "$OUT/build.log"
timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m cuda -q --maxfail=5 tests/test_hopper_gpu.py -p no:cacheprovider \
  > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -15 "$OUT/pytest.log"
if [ "${TUNE:-0}" = 1 ]; then
  timeout ${TUNE_TIMEOUT:-240} python3 benchmarks/hopper_tune.py --out "$OUT/tune.json" \
    --best "$OUT/best_knobs.json" > "$OUT/tune.log" 2>&1
  echo "tune rc=$?"; cat "$OUT/tune.log" | tail -8
  # the sweep runs with the tuned knobs (defaults.py's TILE_KNOBS hold them once recorded)
  [ -s "$OUT/best_knobs.json" ] && export MLAGEN_HOPPER_TILE_KNOBS=$(cat "$OUT/best_knobs.json")
fi
timeout ${SWEEP_TIMEOUT:-240} python3 benchmarks/hopper_sweep.py --out "$OUT/sweep.json" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"
tail -62 "$OUT/sweep.log"
