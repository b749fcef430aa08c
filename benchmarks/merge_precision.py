"""How far the cluster merge's output is from the exact result, beside the path without
clusters (fp32 partials and the combine): the error of each output element against a
float64 reference, on the cluster-plan row (b = 32, s_k = 1024, h_q = 128) with FlashMLA's
data and with randn data (a few keys dominate each row).

    python benchmarks/merge_precision.py            # the cluster merge (default launch)
    MLAGEN_HOPPER_CLUSTER=0 python benchmarks/merge_precision.py   # no clusters

Written for docs/hopper.md step 32 (the exchanged quarter in fp16 with a per-row scale):
run both ways in both trees, the merge's error should stay at the combine's.
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

    mode = "no clusters" if os.environ.get("MLAGEN_HOPPER_CLUSTER") == "0" else "cluster merge"
    for sharp in (False, True):
        errs, rel = [], []
        for seed in range(4):
            inp = inputs(32, [1024 - 3 * i for i in range(32)], 1, 128, 64, seed=seed,
                         sharp=sharp)
            out, _ = run(inp)
            ref, _ = reference(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens,
                               inp.softmax_scale, True)
            e = (out.double() - ref.double()).abs()
            errs.append(e)
            # the error in units of the row's largest |output| (what a per-row scale bounds)
            rel.append(e / ref.double().abs().amax(-1, keepdim=True).clamp(min=1e-30))
        e, r = torch.cat([x.flatten() for x in errs]), torch.cat([x.flatten() for x in rel])
        print(f"{mode:13s} {'randn' if sharp else 'flashmla':8s}: out err max {e.max():.3e} "
              f"mean {e.mean():.3e}; / row max: max {r.max():.3e} mean {r.mean():.3e}")


if __name__ == "__main__":
    main()
