"""How far the output of the 64-row wgmma kernel's merge paths is from the exact result:
the cluster merge (b = 32, s_k = 1024, h_q = 128) and the combine of split pieces (b = 16,
s_q = 2, s_k = 2048, h_q = 64: 4 pieces a request; b = 1, s_k = 32768, h_q = 128: ~64), with
FlashMLA's data and with randn data (a few keys dominate each row).  The error of each
output element against a float64 reference, also in units of its row's largest |output|.

    python benchmarks/merge_precision.py            # the cluster merge (default launch)
    MLAGEN_HOPPER_CLUSTER=0 python benchmarks/merge_precision.py   # no clusters

Written for docs/hopper.md step 32 (the cluster merge's exchange and the split's partials in
fp16 with a per-row scale): run in trees before and after, the errors should not move.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    import torch

    from hopper_util import reference
    from test_hopper_gpu import inputs, run

    mode = "no clusters" if os.environ.get("MLAGEN_HOPPER_CLUSTER") == "0" else "clusters"
    for b, s_q, s_k, h_q in ((32, 1, 1024, 128), (16, 2, 2048, 64), (1, 1, 32768, 128)):
        for sharp in (False, True):
            errs, rel = [], []
            for seed in range(4 if b > 1 else 2):
                inp = inputs(b, [s_k - 3 * i for i in range(b)], s_q, h_q, 64, seed=seed,
                             sharp=sharp)
                out, _ = run(inp)
                ref, _ = reference(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens,
                                   inp.softmax_scale, True)
                e = (out.double() - ref.double()).abs()
                errs.append(e)
                # in units of the row's largest |output| (what a per-row scale bounds)
                rel.append(e / ref.double().abs().amax(-1, keepdim=True).clamp(min=1e-30))
            e = torch.cat([x.flatten() for x in errs])
            r = torch.cat([x.flatten() for x in rel])
            print(f"{mode:11s} b{b} s_q {s_q} {s_k} h{h_q} {'randn' if sharp else 'flashmla':8s}:"
                  f" out err max {e.max():.3e} mean {e.mean():.3e}; / row max: max "
                  f"{r.max():.3e} mean {r.mean():.3e}")

if __name__ == "__main__":
    main()
