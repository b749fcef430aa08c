#!/usr/bin/env bash
# Lead's final visit on merged main: build every variant, all cuda tests, verify runs on the
# Hopper example schedules, sanitizer on the wgmma path, the bench of record; short table last.
# Run from the copy of main: bash final_visit.sh   (COMMIT=<sha>)
set -u
OUT=${OUT:-$PWD/final_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-}
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; nvcc --version | tail -1;
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.device_count(), "gpus")'; echo "commit ${COMMIT:-?}"; } 2>&1 | tee "$OUT/env.txt"
# 1. builds (parallel) via the wgmma visit's build step
STEPS=build OUT=/tmp/wv bash benchmarks/wgmma_visit.sh > /tmp/build.log 2>&1; echo "build done $(el)"; tail -2 /tmp/build.log
# 2. all cuda tests
timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider --maxfail=20 \
  tests/test_hopper_gpu.py tests/test_hopper_wgmma_gpu.py tests/test_hopper_faults.py \
  tests/test_verify_gpu.py tests/test_reference.py tests/test_problem.py > "$OUT/pytest_cuda.log" 2>&1
echo "cuda tests rc=$? $(el)"; tail -4 "$OUT/pytest_cuda.log"
# 3. verify the example schedules (poisoned outputs)
for s in hopper_wgmma hopper_h200; do
  timeout 60 python3 -m mlagen.cli verify schedules/$s.toml --examples 100 > /tmp/verify_$s.log 2>&1
  echo "verify $s rc=$? $(el)"; tail -2 /tmp/verify_$s.log
done | tee "$OUT/verify.log"
# 4. sanitizer on a small wgmma case
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in memcheck synccheck; do
  timeout 90 "$CS" --tool $tool --error-exitcode 9 python3 benchmarks/wgmma_bench.py small > /tmp/san_$tool.log 2>&1
  echo "sanitize $tool rc=$? $(el)"; grep -E "ERROR SUMMARY" /tmp/san_$tool.log | head -2
done | tee "$OUT/sanitize.log"
# 5. the bench of record (API defaults: wgmma for s_q*h_q > 16)
left=$((560 - $(date +%s) + T0)); [ $left -gt 200 ] && left=200
timeout $left python3 -m mlagen.cli bench --target hopper --no-progress --output "$OUT/hopper_bench" > "$OUT/bench.log" 2>&1
echo "bench rc=$? $(el)"
grep -iE "geomean|host" "$OUT/hopper_bench.md" 2>/dev/null | head -8
grep -E "^\| [0-9]" "$OUT/hopper_bench.md" 2>/dev/null | tail -62
