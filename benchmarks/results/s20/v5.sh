#!/usr/bin/env bash
# session 20, visit 5: Nsight Compute on the split kernel of the two graph rows whose 1.2x
# bar stays out of reach (b16 s_q 2 2048 h_q 64; b64 varlen 2048 h_q 128), main as merged
# (fp16 partials), the API's per-shape defaults.  From the repository root, carry [".dev"].
set -u
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo "$(($(date +%s) - T0)) s"; }
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() {  # name, workload args
  local name=$1; shift
  timeout 45 python3 benchmarks/hopper_one_call.py "$@" --api-defaults --calls 1 || return
  timeout 150 "$NCU" --set full --import-source yes --clock-control none \
    -k regex:mla_split_wgmma_kernel --launch-skip 2 --launch-count 1 -f \
    -o /tmp/ncu_$name python3 benchmarks/hopper_one_call.py "$@" --api-defaults --calls 4 > /dev/null 2>&1
  echo "ncu $name rc=$? $(el)"
  "$NCU" -i /tmp/ncu_$name.ncu-rep --page details > "$OUT/details_$name.txt" 2>&1
  "$NCU" -i /tmp/ncu_$name.ncu-rep --page raw --csv 2>&1 | gzip > "$OUT/raw_$name.csv.gz"
  "$NCU" -i /tmp/ncu_$name.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$OUT/sass_$name.csv.gz"
}
prof b16s2 16 2 2048 64
prof b64v 64 1 2048 128 --varlen
grep -E "^  +(Duration|SM Busy|Issue Slots Busy|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|No Eligible|One or More Eligible)" "$OUT"/details_*.txt | head -40
for n in b16s2 b64v; do
  zcat "$OUT/raw_$n.csv.gz" | python3 -c "
import csv,sys
r=list(csv.reader(sys.stdin)); h=r[0]; v=r[2] if len(r)>2 else r[-1]
for k in ('sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active','sm__inst_executed_pipe_tensor_op_gmma.sum','sm__cycles_elapsed.avg','gpc__cycles_elapsed.max','dram__throughput.avg.pct_of_peak_sustained_elapsed','lts__t_sectors.sum'):
  for i,x in enumerate(h):
    if x.startswith(k): print('$n', x, v[i])
"
done
echo "done $(el)"
