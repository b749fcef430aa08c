#!/usr/bin/env bash
# visit 6 (from .dev/main at 3cb1700): racecheck / synccheck of the wgmma kernels with every
# named-barrier arrive turned into a sync (same thread counts; a sanitizer-only experiment:
# does racecheck's report come from its modelling of barrier.arrive?)
set -u
W=/tmp/v6; mkdir -p $W; T0=$(date +%s)
rm -rf ../rcsync && cp -r . ../rcsync && cd ../rcsync
sed -i 's/"barrier.arrive %0, %1;\\n"/"barrier.sync %0, %1;\\n"/' templates/hopper/include/mla_sm90.cuh
grep -n 'barrier.sync %0, %1' templates/hopper/include/mla_sm90.cuh > $W/sed.txt
export PYTHONPATH=$PWD MLAGEN_CACHE_DIR=/tmp/mlagen-cache-rc MLAGEN_BUILD_JOBS=16
timeout 60 python3 benchmarks/wgmma_bench.py small > $W/plain.log 2>&1
echo "0 plain rc=$? [$(( $(date +%s) - T0 )) s] $(tail -1 $W/plain.log)" | tee -a $W/steps.txt
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in racecheck synccheck; do
  timeout 60 "$CS" --tool $tool python3 benchmarks/wgmma_bench.py small > $W/$tool.log 2>&1
  echo "1 $tool rc=$? [$(( $(date +%s) - T0 )) s] $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/$tool.log | head -2 | tr '\n' ' ')" | tee -a $W/steps.txt
  tar czf "$OUT/v6.tgz" -C /tmp v6
done
grep "Race reported" -A1 $W/racecheck.log | head -12
