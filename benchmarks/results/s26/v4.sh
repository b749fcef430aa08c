#!/usr/bin/env bash
# s26 visit 4: WG2 reads P once with ldmatrix and runs its P V from registers (wg2rs), against
# main: does an RS P V cost work per clock also in a warpgroup that runs no softmax under it
# (v3 found WG1's RS P V finishing later while WG1's softmax ran)?  Compute set (outputs
# checked first), 2 alternating rounds, then each tree at the power cap.  ~5 min.
#   COMMIT=<sha> OUT=... bash benchmarks/results/s26/v4.sh
set -u
(cd .dev/main && TREES="main wg2rs" SET=compute ROUNDS=2 POWER=1 OUT=/tmp/v4 \
  bash benchmarks/alt_rows.sh 2>&1 | tail -30)
grep -h -v " ok " /tmp/v4/wg2rs_r1.log | head -5
tar czf $OUT/v4.tgz -C /tmp/v4 .
