#!/usr/bin/env bash
# s23 visit 2: where the bench's host figure (16.7 us in v1) and the breakdown's (11-12.8)
# part: host_time() in fresh processes, plain / after the CLI's imports / GC off / the C++
# path off, each with a CPU calibration; then the GPU suites on the C++ path.
set -u
W=/tmp/v2; mkdir -p $W
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-}
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
pack() { tar czf "$OUT/v2.tgz" -C /tmp v2; }
python3 -c "from mlagen.backends.hopper import fastcall; fastcall.module()" > $W/fastcall.log 2>&1
timeout 70 python3 benchmarks/build_defaults.py > $W/build.log 2>&1
echo "1 build rc=$? $(el)" | tee -a $W/steps.txt
for r in 1 2; do for a in "" "--cli" "--nogc" "off"; do
  if [[ $a == off ]]; then MLAGEN_HOPPER_FASTCALL=0 timeout 40 python3 benchmarks/host_process_probe.py 2>/dev/null | tail -1 | sed 's/^/off /'
  else timeout 40 python3 benchmarks/host_process_probe.py $a 2>/dev/null | tail -1; fi
done; done | tee $W/host.txt
echo "2 host $(el)" | tee -a $W/steps.txt; pack
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_wgmma_gpu.py > $W/pytest_wgmma.log 2>&1
echo "3 wgmma gpu tests rc=$? $(el) $(tail -1 $W/pytest_wgmma.log)" | tee -a $W/steps.txt; pack
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_gpu.py -k "hypothesis or deep or graph or compile" > $W/pytest_gpu.log 2>&1
echo "4 gpu tests rc=$? $(el) $(tail -1 $W/pytest_gpu.log)" | tee -a $W/steps.txt; pack
