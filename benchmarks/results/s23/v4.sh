#!/usr/bin/env bash
# s23 visit 4: get_mla_metadata on the C++ call path too: the CPU tests against this torch,
# the GPU tests through the API (metadata equal to the Python path's, decode against the
# reference), the host breakdown and probe, the quick bench's host line.
set -u
W=/tmp/v4; mkdir -p $W
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_COMMIT=${COMMIT:-}
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
pack() { tar czf "$OUT/v4.tgz" -C /tmp v4; }
python3 -c "from mlagen.backends.hopper import fastcall; fastcall.module()" > $W/fastcall.log 2>&1 &
timeout 70 python3 benchmarks/build_defaults.py > $W/build.log 2>&1; wait
echo "1 build rc=$? $(el)" | tee -a $W/steps.txt
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_fastcall.py tests/test_hopper_gpu.py \
  -k "fastcall or cpp or metadata or graph_replay or torch_compile or repeated" > $W/pytest_gpu.log 2>&1
echo "2 tests rc=$? $(el) $(tail -1 $W/pytest_gpu.log)" | tee -a $W/steps.txt; pack
for i in 1 2; do timeout 40 python3 benchmarks/hopper_host_breakdown.py > $W/host$i.log 2>&1
  timeout 40 python3 benchmarks/host_process_probe.py 2>/dev/null | tail -1 >> $W/probe.txt; done
echo "3 host $(el)" | tee -a $W/steps.txt; cat $W/probe.txt; pack
timeout 60 python3 -m mlagen.cli bench --target hopper --quick --no-progress --output $W/bench_quick > $W/bench.log 2>&1
echo "4 quick bench rc=$? $(el)" | tee -a $W/steps.txt; grep -i "host" $W/bench_quick.md; pack
cat $W/host1.log
