"""Does one kernel's time drift with the GPU's power state?  The same call (and a second
schedule on the same workload) timed in turn for a while, with an idle pause in the middle,
while `nvidia-smi` samples SM clock, power and throttle reasons every 100 ms (the visit
script starts it).  Lines: t (s), which, ms.

    python benchmarks/clock_probe.py [b s_q s_k h_q] > probe.log
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton.testing  # noqa: E402

from mlagen.backends.hopper import bench, tune  # noqa: E402


def main():
    b, s_q, sk, h_q = (int(x) for x in (sys.argv[1:5] or (128, 1, 16384, 128)))
    rows = s_q * h_q
    base = tune.static_default_id(rows)
    cands = {tune.cand_id(k): k for k in tune.candidates("wgmma")}
    other = tune.cand_id(dict(cands[base], split_cost=2))
    a = bench.Caller(b, s_q, sk, h_q, False, tune.schedule_of(cands[base]))
    o = bench.Caller(b, s_q, sk, h_q, False, tune.schedule_of(cands[other]), data=a.data)
    a(), o()
    t0 = time.time()
    for phase in ("hot", "after 5 s idle"):
        for i in range(12):
            for name, c in ((base, a), (other, o)):
                ms = triton.testing.do_bench(c, warmup=10, rep=60, return_mode="median")
                print(f"{time.time() - t0:7.2f} {phase} {name} {ms:.4f}", flush=True)
        time.sleep(5)


if __name__ == "__main__":
    main()
