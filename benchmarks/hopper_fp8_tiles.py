"""Dense decode on 8-bit caches on Hopper: the 64-row kernel against the few-rows kernel
(16- or 32-row tiles), each by its schedule, and the bf16 cache's default, on one
page-shuffled cache quantized (CUDA graphs, each call after an L2-evicting write, the
median).  Prints the three times, their ratios and the two 8-bit kernels' largest output
difference.  The rule it informs: defaults.FP8_KNOBS.

    python benchmarks/hopper_fp8_tiles.py [--kv fp8_e4m3|fp8_ds_mla]
"""

from __future__ import annotations

import argparse

import torch

from hopper_sparse import graphed, timed   # same folder (run as a script)

from mlagen import kvformat
from mlagen.backends.hopper import api
from mlagen.schedule.records import Schedule

ROWS = [(64, 1, 4096, 16), (64, 2, 4096, 16), (64, 1, 4096, 32), (128, 1, 8192, 32),  # b, s_q,
        (32, 1, 4096, 48), (64, 1, 4096, 64), (64, 2, 4096, 64), (128, 1, 4096, 128),  # s_k, h_q
        (32, 2, 8192, 128), (8, 1, 8192, 128), (2, 1, 16384, 128)]


def schedule(kv: str, rows: int) -> Schedule:
    return Schedule.build(target="hopper", dtype="bf16", kv_format=kv, rows_per_tile=rows,
                          block_kv=64, buffers=2, warps=8 if rows == 64 else 4,
                          mainloop="wgmma")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", choices=("fp8_e4m3", "fp8_ds_mla"), default="fp8_e4m3")
    a, flush = ap.parse_args(argv), torch.empty(2 ** 28, dtype=torch.uint8, device="cuda")
    print(f"{'b':>4} {'s_q':>3} {'s_k':>6} {'h_q':>4} {'few':>3} {'few us':>8} {'r64 us':>8} "
          f"{'bf16 us':>8} {'few/r64':>7} {'bf16/r64':>8} {'maxdiff':>8}")
    for b, s_q, s_k, h_q in ROWS:
        g = torch.Generator(device="cuda").manual_seed(0)
        pages = b * s_k // 64
        table = torch.randperm(pages, device="cuda", generator=g).to(torch.int32).view(b, -1)
        vals = torch.randn(pages, 64, 1, 576, device="cuda", generator=g).to(torch.bfloat16)
        dk = torch.full((1,), 1 / 64, device="cuda") if a.kv == "fp8_e4m3" else None
        cache = kvformat.quantize(vals, a.kv, dk)
        q = torch.randn(b, s_q, h_q, 576, device="cuda", generator=g).to(torch.bfloat16)
        lens = torch.full((b,), s_k, dtype=torch.int32, device="cuda")
        rows, few = s_q * h_q, 16 if s_q * h_q <= 16 else 32

        def call(kc, s, kv, dk):
            md, ns = api.get_mla_metadata(lens, rows, 1, schedule=s, kv_format=kv or None)
            return lambda: api.flash_mla_with_kvcache(q, kc, table, lens, 512, md, ns,
                                                      causal=True, schedule=s, descale_k=dk)
        f64, ffew = (call(cache, schedule(a.kv, r), a.kv, dk) for r in (64, few))
        fbf = call(vals, None, "", None)
        d = float((f64()[0].float() - ffew()[0].float()).abs().max())
        t64, tfew, tbf = (timed(graphed(f), 20, flush) for f in (f64, ffew, fbf))
        print(f"{b:>4} {s_q:>3} {s_k:>6} {h_q:>4} {few:>3} {tfew:>8.1f} {t64:>8.1f} "
              f"{tbf:>8.1f} {tfew / t64:>7.2f} {tbf / t64:>8.2f} {d:>8.1e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
