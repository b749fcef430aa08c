#!/usr/bin/env bash
# session 16 visit 7: racecheck micro modes kwgmma / kbulk (the kernel's last two
# ingredients the micro kernel lacked)
set -u
cd .dev/main
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
W=/tmp/w13; mkdir -p $W
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
nvcc -gencode=arch=compute_90a,code=sm_90a -lineinfo -o /tmp/rc benchmarks/racecheck_namedbar.cu
for m in kwgmma kbulk kshape; do
  /tmp/rc $m > $W/plain_$m.log 2>&1
  timeout 60 "$CS" --tool racecheck /tmp/rc $m > $W/micro_$m.log 2>&1
  echo "1 micro $m rc=$? $(el) $(cat $W/plain_$m.log) | $(grep -E 'RACECHECK SUMMARY' $W/micro_$m.log)" | tee -a $W/steps.txt
  grep -m4 -A2 "Race reported\|Potential" $W/micro_$m.log | tee -a $W/steps.txt
done
tar czf "$OUT/w13.tgz" -C /tmp w13
