#!/usr/bin/env bash
# Lead's final visit on merged main, in order of what matters if the time runs out: build the
# default variants, the bench of record, the GPU tests of the default paths (both wgmma
# kernels, the combine), verify runs on the wgmma example schedules, memcheck; a short table
# last.  Every step writes under $OUT as it goes.  Run from the copy of main:
#   COMMIT=<sha> [SKIP_TESTS=1] [FAULTS=1] [TUNE=1] bash benchmarks/final_visit.sh
set -u
OUT=${OUT:-$PWD/final_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-}
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; nvcc --version | tail -1;
  echo "commit ${COMMIT:-?}"; } 2>&1 | tee "$OUT/env.txt"
# 1. the default variants (parallel), with their cold build seconds
timeout ${BUILD_TIMEOUT:-70} python3 benchmarks/build_defaults.py --page16 > "$OUT/build.log" 2>&1
echo "build rc=$? $(el)"; cat "$OUT/build.log" | tail -12
# 1b. TUNE=1: `mlagen tune --space wgmma` first; the bench then reads its table (the one to
# ship as mlagen/backends/hopper/tuned.json), which comes back as $OUT/tuned.json
if [[ ${TUNE:-0} == 1 ]]; then
  export MLAGEN_HOPPER_TUNE_TABLE=$OUT/tuned.json
  timeout ${TUNE_TIMEOUT:-300} python3 -m mlagen.cli tune --target hopper --space wgmma \
    --no-progress > "$OUT/tune.log" 2>&1
  echo "tune rc=$? $(el)"; grep -E "^│ b=" "$OUT/tune.log" | cut -c1-120
fi
# 2. the bench of record (API defaults)
# FM_LIB=<libflashmla.so> (benchmarks/flashmla/build.sh): FlashMLA timed beside each row too
timeout ${BENCH_TIMEOUT:-$([[ -n ${FM_LIB:-} ]] && echo 180 || echo 110)} python3 -m mlagen.cli bench --target hopper --no-progress \
  ${FM_LIB:+--flashmla "$(readlink -f "$FM_LIB")"} --output "$OUT/hopper_bench" > "$OUT/bench.log" 2>&1
echo "bench rc=$? $(el)"; grep -iE "geomean|host" "$OUT/hopper_bench.md" 2>/dev/null | head -4
# 3. GPU tests of the default paths (SKIP_TESTS=1: already run on this kernel code in an
# earlier visit), then with FAULTS=1 the planted faults and the verify runs of test_hopper_faults
if [[ ${SKIP_TESTS:-0} != 1 ]]; then
timeout ${TEST_TIMEOUT:-110} python3 -m pytest -q -x -p no:cacheprovider tests/test_hopper_wgmma_gpu.py \
  tests/test_hopper_gpu.py -k "test_cases or wgmma or rows or cuda_graph or bad_input or bad_page or sm_count or metadata or out_pair" \
  > "$OUT/pytest_gpu.log" 2>&1
echo "gpu tests rc=$? $(el)"; tail -2 "$OUT/pytest_gpu.log"
fi
if [[ ${FAULTS:-0} == 1 ]]; then
  # their 17 libraries built in parallel first: built one after another inside the tests
  # (~7 s each) they took about half of the 240 s that reached 16 of the 20 at 7b43e34
  timeout 120 python3 benchmarks/prebuild_faults.py 16 > "$OUT/prebuild_faults.log" 2>&1
  echo "fault prebuild rc=$? $(el): $(tail -1 "$OUT/prebuild_faults.log")"
  timeout ${FAULT_TIMEOUT:-280} python3 -m pytest -q -p no:cacheprovider tests/test_hopper_faults.py \
    > "$OUT/pytest_faults.log" 2>&1
  echo "fault tests rc=$? $(el)"; grep -E "passed|failed|FAILED" "$OUT/pytest_faults.log" | tail -5
fi
# 4. verify the wgmma examples (outputs poisoned)
for s in hopper_wgmma hopper_wgmma_r16 hopper_wgmma_r32_w8; do
  timeout 40 python3 -m mlagen.cli verify schedules/$s.toml --examples 40 > "$OUT/verify_$s.log" 2>&1
  echo "verify $s rc=$? $(el)"; tail -1 "$OUT/verify_$s.log"
done
# 5. memcheck on a small split case
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
timeout 60 "$CS" --tool memcheck --error-exitcode 9 python3 benchmarks/wgmma_bench.py small > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY" "$OUT/memcheck.log" | head -1
grep -E "^\| [0-9]" "$OUT/hopper_bench.md" 2>/dev/null | tail -62
