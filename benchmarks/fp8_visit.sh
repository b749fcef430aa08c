#!/bin/bash
# One GPU visit for 8-bit KV caches on Hopper ("dequantize" mode, mla_fp8.cuh): build the
# FP8 libraries in parallel, the GPU tests of the FP8 path, verify on the two FP8 examples
# (and their planted faults), compute-sanitizer memcheck on one call of each format, then the
# timing table: our bf16 kernel vs fp8_e4m3 vs fp8_ds_mla on the same shapes (`mlagen bench
# --shape ... --kv-format ...`), printed last.  Logs under $OUT.
#
#   bash benchmarks/fp8_visit.sh [all|tests|bench]     (TESTS_TIMEOUT, BENCH_TIMEOUT in s)
set -u
OUT=${OUT:-/tmp/fp8_visit}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
el() { echo "$(( $(date +%s) - t0 )) s"; }
what=${1:-all}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
git log -1 --format=%h > "$OUT/commit.txt" 2>/dev/null || true

# 1. the libraries the tests and the table load, built side by side (nvcc only)
timeout "${PREBUILD_TIMEOUT:-150}" python3 - > "$OUT/prebuild.log" 2>&1 <<'PY'
import time
from mlagen.backends.hopper import defaults
from mlagen.backends.hopper.tune import build_schedules
from mlagen.paths import SCHEDULES_DIR
from mlagen.schedule import load
from mlagen.schedule.records import Schedule
from mlagen.backends.hopper import FP8_FAULTS
from mlagen.errors import ScheduleError
rows = dict(target="hopper", mainloop="wgmma", block_kv=64, buffers=2, warps=4)
faults = ("none", "kv_scale_wrong_tile", "kv_scale_twice", "descale_not_in_output")
scheds = []
# every legal FP8 variant of the knobs (rows, converters, raw slots), sound and with each
# planted fault of its format (the variants verify's neighbourhood draws reach)
for kv in ("fp8_e4m3", "fp8_ds_mla"):
    for r in (16, 32):
        for cv in (1, 2):
            for rs in (2, 3):
                for f in faults:
                    try:
                        s = Schedule.build(**rows, rows_per_tile=r, kv_format=kv,
                                           fp8_converters=cv, fp8_raw_slots=rs)
                        if f != "none" and f not in FP8_FAULTS[kv]:
                            continue
                        scheds.append(s.with_fault(f))
                    except ScheduleError:
                        pass
scheds += [Schedule.build(**rows, rows_per_tile=r, kv_format="fp8_e4m3", dtype="fp16")
           for r in (16, 32)]
scheds += [defaults.default_schedule(16)]          # the bf16 kernel the table compares with
canon = {c.variant_name(): c for c in (defaults.canonical(s) for s in scheds)}
t = time.time()
errs = build_schedules(list(canon.values()), 16)
print(f"{len(canon)} libraries in {time.time() - t:.1f} s; errors: {[e for e in errs if e] or 'none'}")
PY
echo "prebuild rc=$? $(el): $(tail -1 "$OUT/prebuild.log")"

if [ "$what" != bench ]; then
  # 2. the FP8 GPU tests
  timeout "${TESTS_TIMEOUT:-170}" python3 -m pytest -q -p no:cacheprovider \
    tests/test_hopper_fp8_gpu.py > "$OUT/pytest_fp8.log" 2>&1
  echo "fp8 gpu tests rc=$? $(el)"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest_fp8.log" | tail -12
  # 3. verify reaches the FP8 path through the example schedules; their faults are caught
  timeout "${FAULTS_TIMEOUT:-90}" python3 -m pytest -q -p no:cacheprovider tests/test_hopper_faults.py \
    -k "fp8" > "$OUT/pytest_faults_fp8.log" 2>&1
  echo "verify fp8 faults/examples rc=$? $(el)"; grep -E "passed|failed|FAILED" "$OUT/pytest_faults_fp8.log" | tail -6
  # 4. memcheck on one call of each format
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  timeout "${MEMCHECK_TIMEOUT:-90}" "$CS" --tool memcheck --error-exitcode 9 python3 - > "$OUT/memcheck.log" 2>&1 <<'PY'
import torch
from mlagen.backends.hopper.bench import Caller
for kv in ("fp8_e4m3", "fp8_ds_mla"):
    for s_q, h_q in ((1, 16), (2, 16)):
        c = Caller(3, s_q, 300, h_q, True, kv=kv)
        c()
torch.cuda.synchronize()
print("memcheck calls done")
PY
  echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|calls done" "$OUT/memcheck.log" | head -2
fi

if [ "$what" != tests ] && [ "${CV_AB:-1}" = 1 ]; then
  # 5. the FP8 knobs (fp8_converters, fp8_raw_slots) on the same tensors, do_bench medians
  # (eager, L2 flushed), the bf16 default beside
  timeout "${AB_TIMEOUT:-60}" python3 - > "$OUT/knobs_ab.log" 2>&1 <<'PY'
import triton.testing
from mlagen.backends.hopper.bench import Caller
from mlagen.schedule.records import Schedule
rows = dict(target="hopper", mainloop="wgmma", block_kv=64, buffers=2, warps=4)
for b, sk in ((32, 8192), (128, 8192), (1, 8192)):
    bf = Caller(b, 1, sk, 16, False)
    t_bf = triton.testing.do_bench(bf, warmup=25, rep=200, return_mode="median")
    for kv in ("fp8_e4m3", "fp8_ds_mla"):
        cells = []
        for cv, rs in ((1, 2), (2, 2), (1, 3), (2, 3)):
            s = Schedule.build(**rows, rows_per_tile=16, kv_format=kv, fp8_converters=cv,
                               fp8_raw_slots=rs)
            c = Caller(b, 1, sk, 16, False, s, data=bf.data, kv=kv)
            ms = triton.testing.do_bench(c, warmup=25, rep=200, return_mode="median")
            cells.append(f"cv{cv} raw{rs} {ms * 1e3:.1f} us ({t_bf / ms:.2f}x)")
        print(f"b={b} sk={sk} bf16 {t_bf * 1e3:.1f} us; {kv}: " + ", ".join(cells), flush=True)
PY
  echo "knobs A/B rc=$? $(el)"; cat "$OUT/knobs_ab.log" | tail -8
fi

if [ "$what" != tests ]; then
  # 6. the table: b in {1, 32, 128}, s_q 1, h_q 16, s_k 4096 and 8192, page 64
  SHAPES=${SHAPES:-"1,1,4096,16 32,1,4096,16 128,1,4096,16 1,1,8192,16 32,1,8192,16 128,1,8192,16"}
  timeout "${BENCH_TIMEOUT:-200}" python3 -m mlagen.cli bench --target hopper --no-progress \
    $(for s in $SHAPES; do echo --shape "$s"; done) \
    --kv-format bf16,fp8_e4m3,fp8_ds_mla \
    --output "$OUT/fp8_bench" > "$OUT/bench.log" 2>&1
  echo "bench rc=$? $(el)"
  grep -E "^\| [0-9]|^- b=|Speed of" "$OUT/fp8_bench.md" 2>/dev/null || tail -20 "$OUT/bench.log"
fi
