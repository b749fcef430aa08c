#!/usr/bin/env bash
# One GPU visit: whether a cooperative launch survives graph capture (coop_graph_check.cu),
# the split-plan probe on the bench of record's rows (plan_probe.py), then the planted-fault
# tests of this tree (prebuilt in parallel first).  Logs under $OUT.
set -u
OUT=${OUT:-$PWD/plan_out}; mkdir -p "$OUT"
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
nvcc -gencode=arch=compute_90a,code=sm_90a -o /tmp/coop benchmarks/coop_graph_check.cu && /tmp/coop | tee "$OUT/coop.log"
echo "coop $(el)"
timeout ${PROBE_TIMEOUT:-240} python3 benchmarks/plan_probe.py --out "$OUT/plan_probe.json" ${PROBE_ARGS:-} > "$OUT/plan_probe.log" 2>&1
echo "plan probe rc=$? $(el)"; cat "$OUT/plan_probe.log" | grep -v Warning | tail -60
if [[ ${FAULTS:-1} == 1 ]]; then
  timeout 60 python3 benchmarks/prebuild_faults.py 16 > "$OUT/prebuild.log" 2>&1; echo "prebuild rc=$? $(el)"
  timeout ${FAULT_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider tests/test_hopper_faults.py > "$OUT/faults.log" 2>&1
  echo "faults rc=$? $(el)"; tail -3 "$OUT/faults.log"
fi
