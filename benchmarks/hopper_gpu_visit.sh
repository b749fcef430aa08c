#!/usr/bin/env bash
# One GPU visit: build, (optionally) time candidate knobs, the cuda tests, then the sweep.
# Logs under $OUT (or ./hopper_out): at most 8 files (what a lent machine sends back).
# Usage (from the repository root on the GPU machine): bash benchmarks/hopper_gpu_visit.sh
#   TUNE=1 CANDS="16:16,32,2,8 16:16,32,5,8 ..."   time these (class:rows,bkv,buf,warps) first;
#   the tests and the sweep then run with the fastest per class (MLAGEN_HOPPER_TILE_KNOBS).
set -u
OUT=${OUT:-$PWD/hopper_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export MLAGEN_CACHE_DIR=${MLAGEN_CACHE_DIR:-/tmp/mlagen-cache}
export MLAGEN_BUILD_JOBS=${MLAGEN_BUILD_JOBS:-16}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nvcc --version | tail -1;
  python3 -c 'import torch; print("torch", torch.__version__)'; echo "commit ${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"; } > /tmp/hopper_env.txt 2>&1
cat /tmp/hopper_env.txt
# build every variant the visit uses first (in parallel), so test time is test time
CANDS=${CANDS:-} python3 - <<'PY' > /tmp/hopper_build.log 2>&1
import os, sys, time
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, "tests")
from mlagen.jit import build
from mlagen.backends.hopper import render, defaults
from mlagen.schedule.records import Schedule
import test_hopper_gpu as tg
t = time.time()
knobs = [dict(k) for k in tg.SCHEDULES[1:] + tg.DEEP]
for item in os.environ.get("CANDS", "").split():
    r, b, f, w = (int(x) for x in item.split(":")[1].split(","))
    knobs.append(dict(rows_per_tile=r, block_kv=b, buffers=f, warps=w))
scheds = [defaults.default_schedule(r, d) for r in (16, 32, 64) for d in ("bf16", "fp16")]
scheds += [defaults.canonical(Schedule.build(target="hopper", dtype=d, **k))
           for k in knobs for d in ("bf16", "fp16")]
uniq = {s.variant_name(): s for s in scheds}
with ThreadPoolExecutor(16) as ex:
    for a in ex.map(lambda s: build(render(s)), uniq.values()):
        print(a.path, round(a.seconds, 1))
print(len(uniq), "variants built in", round(time.time() - t, 1), "s")
PY
tail -2 /tmp/hopper_build.log
if [ "${TUNE:-0}" = 1 ]; then
  timeout ${TUNE_TIMEOUT:-120} python3 benchmarks/hopper_tune.py \
    --best "$OUT/best_knobs.json" ${CANDS:+--cands "$CANDS"} > "$OUT/tune.log" 2>&1
  echo "tune rc=$?"; tail -10 "$OUT/tune.log"
  # the tests and the sweep run with the tuned knobs (defaults.py's TILE_KNOBS hold them once recorded)
  [ -s "$OUT/best_knobs.json" ] && export MLAGEN_HOPPER_TILE_KNOBS=$(cat "$OUT/best_knobs.json")
fi
echo "knobs: ${MLAGEN_HOPPER_TILE_KNOBS:-defaults.py}"
timeout ${SWEEP_TIMEOUT:-240} python3 benchmarks/hopper_sweep.py --out "$OUT/sweep.json" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"
grep -E "^b=" "$OUT/sweep.log" | sed -E "s/ +/ /g; s/ TFLOPS.*ratio/ r/; s/ms \(metadata/ms (md/" ; tail -1 "$OUT/sweep.log"
timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m cuda -q --maxfail=5 tests/test_hopper_gpu.py -p no:cacheprovider \
  --durations=5 > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -12 "$OUT/pytest.log"
# BASE=dir: the same tune candidates' timings on an older tree (an A/B in one visit)
if [ -n "${BASE:-}" ] && [ -d "$BASE" ]; then
  cp benchmarks/hopper_tune.py benchmarks/hopper_sweep.py "$BASE/benchmarks/"
  (cd "$BASE" && PYTHONPATH=$PWD MLAGEN_HOPPER_TILE_KNOBS= timeout 120 python3 benchmarks/hopper_tune.py \
     --cands "${BASE_CANDS:?}") > "$OUT/base_tune.log" 2>&1
  echo "base tune rc=$?"; grep -E "^b=" "$OUT/base_tune.log"
fi
timeout 60 python3 benchmarks/hopper_overhead.py > "$OUT/overhead.log" 2>&1; cat "$OUT/overhead.log"
