"""The wgmma main loop beside the mma_sync one and the anchor, on the anchor's compute-bound
rows (b=128; FlashMLA's exact workload: seed 0, table padded to 256 tokens, pages shuffled
with torch.randperm; causal; do_bench median of the decode call, metadata outside).

    python benchmarks/wgmma_bench.py small        one small NaN-poisoned case against the
                                                  reference (also the compute-sanitizer case)
    python benchmarks/wgmma_bench.py time [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))
os.environ.setdefault("MLAGEN_HOPPER_CHECK_INDICES", "0")

from mlagen.backends.hopper import api, defaults  # noqa: E402
from mlagen.schedule.records import Schedule  # noqa: E402

D, DV = 576, 512
ROWS = [(128, 1, 4096, 128), (128, 1, 8192, 128), (128, 1, 4096, 64), (128, 1, 8192, 64),
        (128, 2, 8192, 128), (128, 1, 16384, 128), (128, 1, 8192, 32), (128, 1, 8192, 16)]
WGMMA = Schedule.build(target="hopper", mainloop="wgmma", rows_per_tile=64, block_kv=64,
                       buffers=2, warps=8)


def mma_sync(rows_total):
    """The mma_sync kernel the API picks by default for this many packed rows."""
    knobs = dict(zip(("rows_per_tile", "block_kv", "buffers", "warps"),
                     defaults.tile_knobs()[defaults.size_class(rows_total)]))
    return defaults.canonical(Schedule.build(target="hopper", **knobs))


def workload(b, s_q, mean_sk, h_q, varlen=False):
    g = random.Random(0)
    torch.manual_seed(0)
    lens = ([max(int(g.normalvariate(mean_sk, mean_sk / 2)), s_q) for _ in range(b)]
            if varlen else [mean_sk] * b)
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


def small():
    from test_hopper_gpu import check, inputs
    for sharp in (False, True):
        inp = inputs(3, [65, 1000, 130], 2, 128, 64, seed=1, sharp=sharp)
        check(inp, True, WGMMA)
        inp = inputs(2, [0, 4097], 1, 64, 128, dtype="fp16", seed=2, sharp=sharp)
        check(inp, False, WGMMA.replace(dtype="fp16"))
    print("small: ok")


def time_rows(out_file):
    from triton.testing import do_bench
    anchors = json.loads((HERE / "anchors" / "hopper-best-anchor.json").read_text())
    res = []
    for b, s_q, sk, h_q in ROWS:
        q, k, bt, sl, lens = workload(b, s_q, sk, h_q)
        flops = s_q * sum(lens) * h_q * (D + DV) * 2
        f_ref, f_new = call(q, k, bt, sl, mma_sync(s_q * h_q)), call(q, k, bt, sl, WGMMA)
        o_ref, l_ref = f_ref()
        o_new, l_new = f_new()
        torch.cuda.synchronize()
        err = float((o_new.float() - o_ref.float()).abs().max())
        lerr = float((l_new - l_ref).abs().max())
        t_ref = do_bench(f_ref, warmup=25, rep=200, return_mode="median")
        t_new = do_bench(f_new, warmup=25, rep=200, return_mode="median")
        a = next((r for r in anchors if (r["b"], r["s_q"], r["sk"], r["h_q"], r["varlen"])
                  == (b, s_q, sk, h_q, False)), None)
        row = dict(b=b, s_q=s_q, sk=sk, h_q=h_q, mma_sync_ms=t_ref, wgmma_ms=t_new,
                   mma_sync_tflops=flops / 1e9 / t_ref, wgmma_tflops=flops / 1e9 / t_new,
                   max_abs_diff_vs_mma_sync=err, lse_diff=lerr,
                   anchor_ms=a and a["best_ms"], flashmla_ms=a and a["flashmla_ms"])
        res.append(row)
        print(json.dumps(row), flush=True)
    if out_file:
        Path(out_file).write_text(json.dumps(res, indent=1))
    print(f"{'b s_q sk h_q':>18} | {'mma_sync':>14} | {'wgmma':>14} | {'x mma':>5} | "
          f"{'anchor ms':>9} | {'anchor/wgmma':>12} | diff")
    for r in res:
        an = r["anchor_ms"]
        print(f"{r['b']:>4} {r['s_q']:>2} {r['sk']:>5} {r['h_q']:>4} | "
              f"{r['mma_sync_ms']:.4f} {r['mma_sync_tflops']:5.0f}T | "
              f"{r['wgmma_ms']:.4f} {r['wgmma_tflops']:5.0f}T | "
              f"{r['mma_sync_ms'] / r['wgmma_ms']:5.2f} | "
              f"{an if an else float('nan'):9.4f} | "
              f"{(an / r['wgmma_ms']) if an else float('nan'):12.2f} | "
              f"{r['max_abs_diff_vs_mma_sync']:.2g}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["small", "time"])
    ap.add_argument("--out")
    a = ap.parse_args()
    small() if a.mode == "small" else time_rows(a.out)
