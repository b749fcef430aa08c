#!/usr/bin/env bash
# session 18 visit 4: the cluster merge by one bulk copy a CTA (shared::cta -> shared::cluster), clusters only where the plan can take them
# correct? how many clusters fit? faster on the graph rows than main 524cc6e?
set -u
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16
T0=$(date +%s)
cd .dev/main
PYTHONPATH=$PWD timeout 100 python3 - <<'PY' 2>&1 | tee $OUT/cluster.txt
from mlagen.backends.hopper import api, ops
from mlagen.schedule.records import Schedule
s = Schedule.build(target="hopper", mainloop="wgmma", rows_per_tile=64, block_kv=64, buffers=2, warps=8)
lib = ops.get(api._library_key(128, "bf16", s)).lib
for b, parts in [(32, 66), (33, 66), (16, 66), (32, 132), (16, 132), (33, 132), (8, 66), (64, 66)]:
    print("batch", b, "parts", parts, "cluster", lib.mlagen_hopper_cluster(b, parts))
PY
echo "== cluster tests $(($(date +%s)-T0)) s"
PYTHONPATH=$PWD timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_wgmma_gpu.py -k cluster 2>&1 | tail -25 > $OUT/tests_cluster.txt
tail -5 $OUT/tests_cluster.txt
echo "== graph A/B $(($(date +%s)-T0)) s"
OUT=$OUT/ab TREES="base main" SET=graph ROUNDS=2 bash benchmarks/alt_rows.sh 2>&1 | tail -14
echo "== split probe $(($(date +%s)-T0)) s"
PYTHONPATH=$PWD timeout 60 python3 benchmarks/hopper_split_probe.py --quick --out $OUT/probe_main.json 2>&1 | tail -8
echo "== broad tests $(($(date +%s)-T0)) s"
PYTHONPATH=$PWD timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_wgmma_gpu.py tests/test_hopper_gpu.py -k "planted or (test_cases and wgmma) or graph or metadata" 2>&1 | tail -40 > $OUT/tests_broad.txt
grep -E "passed|failed|^E .*(assert|md)" $OUT/tests_broad.txt | head -8
PYTHONPATH=$PWD timeout 30 python3 - <<'PY' 2>&1 | grep -v Warn
import sys, torch
sys.path.insert(0, "tests")
from test_hopper_gpu import inputs, api
from mlagen.paths import SCHEDULES_DIR
from mlagen.schedule import load
sched = load(SCHEDULES_DIR / "hopper_wgmma.toml")
inp = inputs(32, [4097] * 16 + [0, 1, 63, 64, 65, 1000, 2000, 3000] * 2, 1, 128, 64, seed=5)
md, ns = api().get_mla_metadata(inp.cache_seqlens, 128, 1, schedule=sched)
print("parts", md.shape[0], "md5", md[:, 5].tolist()[:8], "ns", ns.tolist()[:8], "lens", inp.cache_seqlens.tolist()[:20])
PY
echo "== done $(($(date +%s)-T0)) s"
