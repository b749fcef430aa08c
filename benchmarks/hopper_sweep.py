"""FlashMLA's decode sweep on the Hopper kernels, against the anchor (the better of FlashMLA
and FlashAttention-3 per row, benchmarks/anchors/hopper-best-anchor.json).

Same inputs and formulas as the anchor: random data, shuffled block table, causal, h_kv = 1,
d = 576, dv = 512, page 64; varlen seqlen_i = max(normal(mean, mean/2), s_q);
FLOPs = s_q * total_seqlens * h_q * (d + dv) * 2;
bytes = (total_seqlens * h_kv * d + b * s_q * h_q * d + b * s_q * h_q * dv) * 2;
time = triton.testing.do_bench median over flash_mla_with_kvcache (split + combine), as the
anchor was timed: get_mla_metadata runs once per decode step (shared by every layer) outside
the timing; its own time is reported beside (meta_ms).

    python benchmarks/hopper_sweep.py [--rows N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mlagen.backends.hopper import api  # noqa: E402

D, DV, PAGE = 576, 512, 64


def workload(b, s_q, mean_sk, h_q, varlen, seed=0):
    g = torch.Generator().manual_seed(seed)
    if varlen:
        lens = [max(int(torch.normal(float(mean_sk), mean_sk / 2, (1,), generator=g)), s_q)
                for _ in range(b)]
    else:
        lens = [mean_sk] * b
    max_blocks = max(math.ceil(x / PAGE) for x in lens)
    num_blocks = b * max_blocks
    dev = "cuda"
    q = torch.randn(b, s_q, h_q, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(num_blocks, PAGE, 1, D, device=dev, dtype=torch.bfloat16)
    bt = torch.randperm(num_blocks, device=dev, dtype=torch.int32).view(b, max_blocks)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
    return q, k, bt, seqlens, lens


def bench_row(row):
    import triton.testing

    b, s_q, sk, h_q, varlen = row["b"], row["s_q"], row["sk"], row["h_q"], row["varlen"]
    q, k, bt, seqlens, lens = workload(b, s_q, sk, h_q, varlen)

    md, ns = api.get_mla_metadata(seqlens, s_q * h_q, 1)

    def call():
        return api.flash_mla_with_kvcache(q, k, bt, seqlens, DV, md, ns, causal=True)

    call()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
    meta_ms = triton.testing.do_bench(lambda: api.get_mla_metadata(seqlens, s_q * h_q, 1),
                                      warmup=5, rep=20, return_mode="median")
    total = sum(lens)
    flops = s_q * total * h_q * (D + DV) * 2
    nbytes = (total * 1 * D + b * s_q * h_q * D + b * s_q * h_q * DV) * 2
    return dict(row, ms=ms, meta_ms=meta_ms, tflops=flops / 1e9 / ms, gbps=nbytes / 1e6 / ms,
                ratio=row["best_ms"] / ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=0, help="only the first N rows")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    rows = json.loads((HERE / "anchors" / "hopper-best-anchor.json").read_text())
    if args.rows:
        rows = rows[:args.rows]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    results = []
    for row in rows:
        r = bench_row(row)
        results.append(r)
        print(f"b={r['b']:4d} s_q={r['s_q']} sk={r['sk']:6d} h_q={r['h_q']:3d} "
              f"varlen={int(r['varlen'])}  {r['ms']:.4f} ms (metadata {r['meta_ms']:.4f}) "
              f"{r['tflops']:6.1f} TFLOPS "
              f"{r['gbps']:6.0f} GB/s  anchor {r['best_ms']:.4f} ms ({r['best']})  "
              f"ratio {r['ratio']:.3f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    won = sum(r["ratio"] >= 1 for r in results)
    geo = math.exp(sum(math.log(r["ratio"]) for r in results) / len(results))
    print("\n| b | s_q | sk | h_q | varlen | ms | TFLOPS | GB/s | anchor ms | ratio | metadata ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['b']} | {r['s_q']} | {r['sk']} | {r['h_q']} | {'yes' if r['varlen'] else 'no'}"
              f" | {r['ms']:.4f} | {r['tflops']:.1f} | {r['gbps']:.0f} | {r['best_ms']:.4f} | "
              f"{r['ratio']:.3f} | {r['meta_ms']:.4f} |")
    print(f"\nrows won: {won}/{len(results)}; geometric mean ratio (anchor/ours): {geo:.3f}")


if __name__ == "__main__":
    main()
