#!/usr/bin/env bash
# session 16 visit 9 (prepared, not run): racecheck on cut-down trees of the 64-row kernel:
# store_o keeping its staging but not its bulk copies (rc_nobulk), or not its __syncwarp()s
# (rc_nosw); outputs wrong, only the hazard reports matter.  Run from the checkout root with
# .dev/main a copy of the tree (as the other visits); it makes the two trees itself.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
W=/tmp/w15; mkdir -p $W
H=templates/hopper/include/mla_wgmma.cuh
for t in rc_nobulk rc_nosw; do rm -rf .dev/$t && cp -r .dev/main .dev/$t; done
python3 - <<'PY'
H = "templates/hopper/include/mla_wgmma.cuh"
for t, old, new in (("rc_nobulk", "if (copy)", "if (false && copy)"),
                    ("rc_nosw", "__syncwarp();", "/* cut */")):
    p = f".dev/{t}/{H}"
    s = open(p).read()
    i = s.index("  static __device__ __forceinline__ void store_o(")
    j = s.index("  // ---------------------------------------------------------------- WG2")
    open(p, "w").write(s[:i] + s[i:j].replace(old, new) + s[j:])
PY
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 MLAGEN_HOPPER_CHECK_INDICES=0
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for t in rc_nobulk rc_nosw; do
  (cd .dev/$t && PYTHONPATH=$PWD timeout 90 "$CS" --tool racecheck python3 benchmarks/wgmma_bench.py small > $W/$t.log 2>&1)
  echo "$t rc=$? $(el) $(grep -E 'RACECHECK SUMMARY' $W/$t.log)" | tee -a $W/steps.txt
  grep -h "Race reported" -A1 $W/$t.log | grep -o "mla_[a-z0-9_]*.cuh:[0-9]*" | sort | uniq -c | tee -a $W/steps.txt
done
tar czf "$OUT/w15.tgz" -C /tmp w15
