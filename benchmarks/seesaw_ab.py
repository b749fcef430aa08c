"""Time the wgmma kernel of this tree on the anchor's rows (FlashMLA's exact workload, see
wgmma_bench.py) and save its outputs, so that two trees can be compared in one visit.

    python benchmarks/seesaw_ab.py OUT_PREFIX            time + save OUT_PREFIX.json/.pt
    python benchmarks/seesaw_ab.py --compare A B         max |A - B| per row, A/B times
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

os.environ.setdefault("MLAGEN_HOPPER_CHECK_INDICES", "0")

# mlagen from PYTHONPATH (the tree being timed), not from this file's tree
from mlagen.backends.hopper import api  # noqa: E402
from mlagen.schedule.records import Schedule  # noqa: E402

D, DV = 576, 512
WGMMA = Schedule.build(target="hopper", mainloop="wgmma", rows_per_tile=64, block_kv=64,
                       buffers=2, warps=8)


def workload(b, s_q, mean_sk, h_q):
    """wgmma_bench.py's: FlashMLA's fixed-length rows, seed 0, randperm pages."""
    import math
    torch.manual_seed(0)
    lens = [mean_sk] * b
    max_pad = math.ceil(max(lens) / 256) * 256
    num_blocks = b * max_pad // 64
    bt = torch.randperm(num_blocks, dtype=torch.int32).view(b, max_pad // 64).cuda()
    q = torch.randn(b, s_q, h_q, D, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(num_blocks, 64, 1, D, dtype=torch.bfloat16, device="cuda")
    return q, k, bt, torch.tensor(lens, dtype=torch.int32, device="cuda"), lens


def call(q, k, bt, sl, schedule):
    s_q, h_q = q.shape[1], q.shape[2]
    md, ns = api.get_mla_metadata(sl, s_q * h_q, 1, schedule=schedule)
    return (lambda: api.flash_mla_with_kvcache(q, k, bt, sl, DV, md, ns, causal=True,
                                                schedule=schedule))

ROWS = [(128, 1, 8192, 128), (128, 1, 4096, 128), (128, 2, 8192, 64), (128, 1, 8192, 64),
        (128, 1, 8192, 32)][:int(os.environ.get("SEESAW_ROWS", "5"))]


def run(prefix):
    from triton.testing import do_bench
    res, outs = [], {}
    for b, s_q, sk, h_q in ROWS:
        q, k, bt, sl, lens = workload(b, s_q, sk, h_q)
        f = call(q, k, bt, sl, WGMMA)
        o, lse = f()
        torch.cuda.synchronize()
        t = do_bench(f, warmup=25, rep=150, return_mode="median")
        flops = s_q * sum(lens) * h_q * (D + DV) * 2
        res.append(dict(row=[b, s_q, sk, h_q], ms=t, tflops=flops / 1e9 / t,
                        finite=bool(torch.isfinite(o).all())))
        outs[str((b, s_q, sk, h_q))] = (o.cpu(), lse.cpu())
        print(json.dumps(res[-1]), flush=True)
    Path(prefix + ".json").write_text(json.dumps(res))
    torch.save(outs, prefix + ".pt")


def compare(a, b):
    ra, rb = json.loads(Path(a + ".json").read_text()), json.loads(Path(b + ".json").read_text())
    oa, ob = torch.load(a + ".pt"), torch.load(b + ".pt")
    print(f"{'b s_q sk h_q':>16} | {'A ms':>7} {'A TF':>5} | {'B ms':>7} {'B TF':>5} | B/A | max|dO| max|dlse|")
    for x, y in zip(ra, rb):
        key = str(tuple(x["row"]))
        do = float((oa[key][0].float() - ob[key][0].float()).abs().max())
        dl = float((oa[key][1] - ob[key][1]).abs().max())
        print(f"{' '.join(map(str, x['row'])):>16} | {x['ms']:.4f} {x['tflops']:5.0f} | "
              f"{y['ms']:.4f} {y['tflops']:5.0f} | {x['ms'] / y['ms']:.2f} | {do:.3g} {dl:.3g}")


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        run(sys.argv[1])
