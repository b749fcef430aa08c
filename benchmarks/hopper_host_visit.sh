#!/usr/bin/env bash
# One GPU visit for the host side of issue 8: build every variant the visit uses (in
# parallel), the cuda tests, the benchmark of record (51 anchor rows + 8 graph rows + host us),
# the planted Hopper faults, a tune smoke run; a short table last.  Logs under $OUT (7 files).
# Usage (repository root on the GPU machine): bash benchmarks/hopper_host_visit.sh
set -u
OUT=${OUT:-$PWD/hopper_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export MLAGEN_CACHE_DIR=${MLAGEN_CACHE_DIR:-/tmp/mlagen-cache}
export MLAGEN_COMMIT=${COMMIT:-}
export MLAGEN_HOPPER_TUNE_TABLE=/tmp/hopper_tune.json   # $OUT keeps at most 8 files
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; nvcc --version | tail -1;
  python3 -c 'import torch; print("torch", torch.__version__)'; echo "commit ${COMMIT:-unknown}"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
python3 - <<'PY' > /tmp/hopper_build.log 2>&1
import sys, time
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, "tests")
from pathlib import Path
from mlagen.jit import build
from mlagen.backends.hopper import render, defaults
from mlagen.schedule import load
from mlagen.schedule.records import Schedule
import test_hopper_gpu as tg, test_hopper_faults as tf
t = time.time()
scheds = [defaults.default_schedule(r, d) for r in (16, 32, 64) for d in ("bf16", "fp16")]
scheds += [defaults.canonical(Schedule.build(target="hopper", dtype=d, **k))
           for k in tg.SCHEDULES[1:] + tg.DEEP for d in ("bf16", "fp16")]
scheds += [defaults.canonical(load(f"schedules/{e}.toml")) for e in tf.EXAMPLES]
scheds += [defaults.canonical(load(f"schedules/{e}.toml").with_fault(f)) for f, e in tf.FAULTED]
uniq = {s.variant_name(): s for s in scheds}
def one(s):
    try:
        a = build(render(s)); return f"{a.path} {a.seconds:.1f}"
    except Exception as e:
        return f"FAILED {s.variant_name()}: {e}"
with ThreadPoolExecutor(16) as ex:
    for line in ex.map(one, uniq.values()):
        print(line)
print(len(uniq), "variants built in", round(time.time() - t, 1), "s")
PY
grep FAILED /tmp/hopper_build.log | head -5; tail -1 /tmp/hopper_build.log
timeout ${TEST_TIMEOUT:-100} python3 -m pytest -m cuda -q --maxfail=5 tests/test_hopper_gpu.py -p no:cacheprovider \
  --durations=3 > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? ($(($(date +%s) - T0)) s)"; tail -6 "$OUT/pytest.log"
timeout ${BENCH_TIMEOUT:-160} python3 -m mlagen.cli bench --target hopper --no-progress \
  --output "$OUT/hopper_bench" > "$OUT/bench.log" 2>&1
echo "bench rc=$? ($(($(date +%s) - T0)) s)"
timeout ${FAULT_TIMEOUT:-70} python3 -m pytest -m cuda -q tests/test_hopper_faults.py -p no:cacheprovider \
  > "$OUT/faults.log" 2>&1
echo "faults rc=$? ($(($(date +%s) - T0)) s)"; tail -4 "$OUT/faults.log"
timeout 25 python3 -m mlagen.cli tune --target hopper --space defaults --no-progress \
  --shape 8,1,8192,16,varlen --shape 128,1,8192,16 > "$OUT/tune.log" 2>&1
echo "tune rc=$? ($(($(date +%s) - T0)) s)"; tail -8 "$OUT/tune.log"
grep -E "^(geomean|\*\*geomean|Host time)" "$OUT/hopper_bench.md" "$OUT/bench.log" 2>/dev/null
grep -E "^\| [0-9]" "$OUT/hopper_bench.md" 2>/dev/null | awk -F'|' '{print $2,$3,$4,$5,$6,$7,"eager",$8,"graph",$9,"kern",$10,"r",$14,$15}' | tail -59
