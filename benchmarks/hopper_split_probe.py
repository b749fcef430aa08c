"""Where the small-batch graph rows' time goes: the split kernel and the combine apart, and
how the split policy moves them (GPU only).

    python benchmarks/hopper_split_probe.py [--out probe.json]

1. For the graph rows with s_q * h_q >= 64, the default (wgmma) schedule with split_cost
   2, 5, 8, 16: graph us per call, and the split / combine kernels' own durations (torch
   profiler, mean over 10 calls).
2. b=32, s_k=1024, h_q=128 with fixed splits 1, 2, 4 (16, 8, 4 blocks per CTA): the slope
   and intercept of a CTA's time against its blocks (fixed cost per piece vs per block).
3. --overhead: every CTA gets exactly n 64-key blocks (n = 0..16), direct output (b = 66,
   split_kv 1) or partials + combine (b = 2, split_kv 33), 132 or 66 CTAs: the split
   kernel's time against n, whose intercept is the fixed cost of a CTA.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from mlagen.backends.hopper import defaults
from mlagen.backends.hopper.bench import (Caller, check_output, graph_rows, kernel_events,
                                          time_graph)


def kernel_times(c: Caller, calls: int = 10) -> dict[str, float]:
    """Mean us per call of each kernel (split, combine, metadata)."""
    out: dict[str, float] = {}
    for n, start, end in kernel_events(c, calls):
        kind = "combine" if "combine" in n else "split" if "split" in n else \
            "metadata" if "sched" in n else n[:24]
        out[kind] = out.get(kind, 0.0) + end - start
    return {k: round(v / calls, 2) for k, v in out.items()}


def one(b, s_q, sk, h_q, varlen, schedule) -> dict:
    c = Caller(b, s_q, sk, h_q, varlen, schedule)
    status, _, _ = check_output(c)
    return {"check": status, "graph_us": round(time_graph(c) * 1e3, 2),
            "kernels_us": kernel_times(c), "splits": int(c.ns[-1].item()),
            "parts": int(c.md.shape[0])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="split_probe.json")
    ap.add_argument("--overhead", action="store_true")
    ap.add_argument("--quick", action="store_true", help="the default split cost only")
    args = ap.parse_args()
    if args.overhead:
        return overhead(args.out)
    res = {"gpu": torch.cuda.get_device_name(), "policy": [], "fixed": []}
    base = defaults.default_schedule(128)
    for r in graph_rows():
        if r["s_q"] * r["h_q"] < 64 or r["b"] >= 128:
            continue
        for cost in ((base.mapping.split_cost,) if args.quick else (2, 5, 8, 16)):
            row = dict(b=r["b"], s_q=r["s_q"], sk=r["sk"], h_q=r["h_q"], varlen=r["varlen"])
            m = one(**row, schedule=base.replace(split_cost=cost))
            res["policy"].append({**row, "split_cost": cost, **m})
            print(row, cost, m, flush=True)
    for n in (() if args.quick else (1, 2, 4)):
        m = one(32, 1, 1024, 128, False, base.replace(split_kv=n))
        res["fixed"].append({"split_kv": n, "blocks_per_cta": 16 // n, **m})
        print("fixed", n, m, flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print("\n| b | s_q | sk | h_q | split_cost | splits | graph us | split us | combine us |")
    for p in res["policy"]:
        k = p["kernels_us"]
        print(f"| {p['b']} | {p['s_q']} | {p['sk']} | {p['h_q']} | {p['split_cost']} | "
              f"{p['splits']} | {p['graph_us']} | {k.get('split')} | {k.get('combine')} |")
    for p in res["fixed"]:
        k = p["kernels_us"]
        print(f"fixed {p['split_kv']}: blocks/cta {p['blocks_per_cta']} graph {p['graph_us']} "
              f"split {k.get('split')} combine {k.get('combine')}")


def overhead(out: str) -> None:
    base = defaults.default_schedule(128)
    res = []
    for label, b, h_q, splits, per in (("partials 132 CTAs", 2, 128, 33, 33),
                                       ("direct 66 CTAs", 66, 64, 1, 1),
                                       ("direct 132 CTAs", 66, 128, 1, 1)):
        for n in (0, 1, 2, 4, 8, 16):
            sk = max(1, 64 * n * per)
            m = one(b, 1, sk, h_q, False, base.replace(split_kv=splits))
            res.append({"case": label, "blocks": n, **m})
            print(label, n, m, flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print("\n| case | blocks per CTA | split us | combine us | graph us |")
    for r in res:
        k = r["kernels_us"]
        print(f"| {r['case']} | {r['blocks']} | {k.get('split')} | {k.get('combine')} | "
              f"{r['graph_us']} |")


if __name__ == "__main__":
    main()
