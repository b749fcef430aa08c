#!/usr/bin/env bash
# session 19, visit 2: %globaltimer stamps per CTA of the split kernel's steps (the cluster
# merge's ~6 us): a tree patched with stamps (.dev/trace: main 29f5ad7 + g_mtrace, not for
# main), b32 s1024 h128 with and without clusters, graph and eager; b16 s_q 2 for scale.
set -u
export MLAGEN_CACHE_DIR=/tmp/mlagen-cache MLAGEN_BUILD_JOBS=16 PYTHONUNBUFFERED=1
cd .dev/trace
for c in 1 0; do
  for m in --graph ""; do
    echo "== b32 cluster=$c $m"
    MLAGEN_HOPPER_CLUSTER=$c PYTHONPATH=$PWD timeout 120 python3 probe/merge_trace.py 32 1 1024 128 $m 2>&1 | grep -v Warn
  done
done
echo "== b16 s2 graph"
PYTHONPATH=$PWD timeout 120 python3 probe/merge_trace.py 16 2 2048 64 --graph 2>&1 | grep -v Warn
