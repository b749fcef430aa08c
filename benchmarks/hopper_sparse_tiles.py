"""Token-sparse decode on Hopper: the 64-row kernel's sparse mode against the 32-row rows
kernel (each by its schedule) on the same tensors in the same process, V3.2's rows
(hopper_sparse.py's tensors and timing: page-shuffled caches, distinct random positions,
each call after an L2-evicting write, the median), eager and replayed in CUDA graphs (the
kernels alone: at a few tokens an eager call's host time can exceed its kernels', so a busy
host moves the eager columns).  Prints a table: both times each way, their ratios, the
gathered bytes a second of the 64-row graph and the largest output difference.  The rule
it informs: sparse.WIDE_TOKENS.

    python benchmarks/hopper_sparse_tiles.py [--kv bf16|fp8_ds_mla] [--reps N]
"""

from __future__ import annotations

import argparse

import torch

from hopper_sparse import graphed, make, read_ceiling, timed   # same folder (run as a script)

from mlagen.backends.hopper import api
from mlagen.schedule.records import Schedule

# (h_q, b, topk), s_q 2, s_k 32768
ROWS = [(128, 1, 2048), (128, 2, 2048), (96, 2, 2048), (96, 8, 2048), (128, 8, 2048),
        (128, 16, 2048), (128, 32, 2048), (128, 64, 2048), (128, 74, 2048), (128, 128, 2048),
        (64, 1, 2048), (64, 4, 2048), (64, 8, 2048), (64, 16, 2048), (64, 32, 2048),
        (64, 64, 2048), (48, 8, 2048), (48, 16, 2048), (48, 64, 2048), (128, 148, 16384)]


def schedule(kv: str, rows: int) -> Schedule:
    return Schedule.build(target="hopper", dtype="bf16", kv_format="" if kv == "bf16" else kv,
                          attention="sparse", topk=2048, causal=False, rows_per_tile=rows,
                          block_kv=64, buffers=2, warps=8 if rows == 64 else 4,
                          mainloop="wgmma")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", choices=("bf16", "fp8_ds_mla"), default="bf16")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    flush = torch.empty(2 ** 28, dtype=torch.uint8, device="cuda")
    print(f"read ceiling {read_ceiling(flush):.0f} GB/s")
    print(f"{'h_q':>4} {'b':>4} {'topk':>6} {'r64 us':>8} {'r32 us':>8} {'r32/r64':>7} "
          f"{'r64 gr':>8} {'r32 gr':>8} {'gr r32/r64':>10} {'GB/s':>6} {'maxdiff':>8}")
    fp8 = a.kv == "fp8_ds_mla"
    s64, s32 = schedule(a.kv, 64), schedule(a.kv, 32)
    for h_q, b, topk in ROWS:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, cache, idx = make(h_q, 2, topk, 32768, b, a.kv, g)
        m64, _ = api.get_mla_metadata()
        m32, _ = api.get_mla_metadata()

        def call(meta, s):
            return lambda: api.flash_mla_with_kvcache(q, cache, None, None, 512, meta,
                                                      indices=idx, is_fp8_kvcache=fp8,
                                                      schedule=s)
        f64, f32 = call(m64, s64), call(m32, s32)
        d = float((f64()[0].float() - f32()[0].float()).abs().max())
        t64, t32 = timed(f64, a.reps, flush), timed(f32, a.reps, flush)
        g64, g32 = timed(graphed(f64), a.reps, flush), timed(graphed(f32), a.reps, flush)
        gbps = b * 2 * topk * (656 if fp8 else 1152) / g64 / 1e3
        print(f"{h_q:>4} {b:>4} {topk:>6} {t64:>8.1f} {t32:>8.1f} {t32 / t64:>7.2f} "
              f"{g64:>8.1f} {g32:>8.1f} {g32 / g64:>10.2f} {gbps:>6.0f} {d:>8.2e}", flush=True)
        del q, cache, idx
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
