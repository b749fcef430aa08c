#!/usr/bin/env bash
# s23 visit 1: the C++ call path (fastcall.cpp) on the H200: its cold build, its CPU tests
# against this torch, the GPU tests that drive it through the API, the host breakdown in
# three processes (C++ path and Python path in each), the bench of record (no FlashMLA).
set -u
W=/tmp/v1; mkdir -p $W
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-}
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
pack() { tar czf "$OUT/v1.tgz" -C /tmp v1; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; nvcc --version | tail -1;
  python3 -c 'import torch, sys; print("torch", torch.__version__, sys.version.split()[0])'; nproc; echo "commit ${COMMIT:-?}"; } > $W/env.txt 2>&1
python3 - > $W/fastcall_build.log 2>&1 <<'PY'
import time; t = time.time()
from mlagen.backends.hopper import fastcall
m = fastcall.module(); print("built" if m else "FAILED", f"{time.time() - t:.1f} s", fastcall.build_dir())
PY
echo "0 fastcall cold build $(el) $(tail -1 $W/fastcall_build.log)" | tee -a $W/steps.txt
timeout 70 python3 benchmarks/build_defaults.py > $W/build.log 2>&1
echo "1 build rc=$? $(el) $(tail -1 $W/build.log)" | tee -a $W/steps.txt; pack
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_fastcall.py tests/test_hopper_gpu.py \
  -k "fastcall or cpp or repeated or graph_replay or torch_compile or bad_input or strict or out_pair or noncontiguous or plan_carries or (test_cases and wgmma)" > $W/pytest_gpu.log 2>&1
echo "2 gpu tests rc=$? $(el) $(tail -1 $W/pytest_gpu.log)" | tee -a $W/steps.txt; pack
for i in 1 2 3; do
  timeout 60 python3 benchmarks/hopper_host_breakdown.py > $W/host$i.log 2>&1
  echo "3.$i host rc=$? $(el) $(grep -E '^call x300' $W/host$i.log | tr '\n' ' ')" | tee -a $W/steps.txt
done; pack
timeout 170 python3 -m mlagen.cli bench --target hopper --no-progress --output $W/hopper_bench > $W/bench.log 2>&1
echo "4 bench rc=$? $(el)" | tee -a $W/steps.txt; grep -iE "geomean|host" $W/hopper_bench.md | head -3; pack
cat $W/host1.log
