"""Is the small-batch split kernel's time per 64-key block bound by where K comes from?
(GPU only.)  Every CTA gets exactly n blocks (split_kv 1, direct output, b = 66: 132 CTAs at
h_q = 128, 66 at h_q = 64), its pages either spread over the cache (the bench's shuffled
table: K from DRAM) or every request reading request 0's pages (K from L2 after the first
CTA's touch).  The slope of graph us per call against n, in both, is the time per block with
and without DRAM behind the ring.

    python benchmarks/latency_probe.py [--out latency_probe.json]
    python benchmarks/latency_probe.py --h-q 128 --blocks 1,2,8 --k dram --no-check
        (timing only: for trees whose kernel was cut down to time one stage's absence)
"""

from __future__ import annotations

import argparse
import json

import torch

from mlagen.backends.hopper import defaults
from mlagen.backends.hopper.bench import Caller, check_output, time_graph


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="latency_probe.json")
    ap.add_argument("--h-q", default="128,64")
    ap.add_argument("--blocks", default="2,8,16")
    ap.add_argument("--k", default="dram,l2")
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args()
    heads = [int(x) for x in args.h_q.split(",")]
    blocks = [int(x) for x in args.blocks.split(",")]
    wheres = args.k.split(",")
    if not set(wheres) <= {"dram", "l2"}:
        ap.error(f"--k {args.k}: dram, l2 or both")
    wheres = sorted(set(wheres), key=["dram", "l2"].index)   # l2 rewrites the table: last
    base = defaults.default_schedule(128).replace(split_kv=1)
    res = []
    for h_q in heads:
        for n in blocks:
            c = Caller(66, 1, max(1, 64 * n), h_q, False, base)
            for where in wheres:
                if where == "l2":
                    c.bt.copy_(c.bt[0:1].clone().expand_as(c.bt))
                status = "unchecked" if args.no_check else check_output(c)[0]
                us = round(time_graph(c) * 1e3, 2)
                res.append({"h_q": h_q, "blocks": n, "k": where, "check": status, "graph_us": us})
                print(res[-1], flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"\n| h_q | K from | us at {' / '.join(map(str, blocks))} blocks | us per block |")
    for h_q in heads:
        for where in wheres:
            us = [r["graph_us"] for r in res if r["h_q"] == h_q and r["k"] == where]
            slope = (us[-1] - us[0]) / (blocks[-1] - blocks[0]) if len(us) > 1 else float("nan")
            print(f"| {h_q} | {where} | {' / '.join(map(str, us))} | {slope:.3f} |")


if __name__ == "__main__":
    main()
