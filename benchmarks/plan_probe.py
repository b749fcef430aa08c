"""What the split plan costs on the bench of record's rows: the default plan against two
others built here in Python and handed to the API as tile_scheduler_metadata (GPU only).

    python benchmarks/plan_probe.py [--out plan_probe.json] [--cost 5] [--rows all|fixed]

The default plan (mla_scheduler.cuh) balances parts exactly: a b = 128 batch of equal
requests over 132 parts splits ~122 of them, so most CTAs run two pieces (two Q loads, two
epilogues of fp32 partials) and the combine reads every partial back.  The others:
  whole   contiguous parts of whole requests (a request longer than a part still splits),
          the smallest max load found by bisection, each piece costing `cost` blocks;
  greedy  contiguous parts with splits allowed, each piece (not each request) costing
          `cost` blocks, bisected the same way.
Each plan's output is checked against the reference before it is timed (do_bench median,
eager), the three plans of a row in turn.
"""

from __future__ import annotations

import argparse
import json

import torch

from mlagen.backends.hopper import scheduler
from mlagen.backends.hopper.bench import Caller, check_output, plan_rows, time_eager

SB = scheduler.SCHED_BLOCK


def place(nblk: list[int], parts: int, cap: int, cost: int, split: bool):
    """Pieces [(part, request, first block, end block)] filling parts of load <= cap, or
    None.  A request goes whole to the current part if it fits; else it is split there
    (split, or when it cannot fit any part whole) or starts the next part."""
    out, p, cur = [], 0, 0
    for r, n in enumerate(nblk):
        b0 = 0
        while True:
            room = cap - cur - cost
            if n - b0 <= room:
                out.append((p, r, b0, n))
                cur += n - b0 + cost
                break
            whole_fits = n - b0 + cost <= cap
            if room >= 1 and (split or not whole_fits):
                out.append((p, r, b0, b0 + room))
                b0 += room
            p, cur = p + 1, 0
            if p >= parts:
                return None
    return out


def build(nblk: list[int], parts: int, cost: int, split: bool):
    """(meta [parts][8], num_splits [b+1]) of the smallest feasible cap."""
    lo, hi = 1, sum(nblk) + cost * len(nblk) + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if place(nblk, parts, mid, cost, split) is None:
            lo = mid + 1
        else:
            hi = mid
    pieces = place(nblk, parts, lo, cost, split)
    b = len(nblk)
    count = [0] * b
    idx = []
    for _, r, _, _ in pieces:
        idx.append(count[r])
        count[r] += 1
    ns = [0]
    for c in count:
        ns.append(ns[-1] + c)
    meta = []
    for p in range(parts):
        mine = [(i, x) for i, x in enumerate(pieces) if x[0] == p]
        if not mine:
            meta.append([b, 0, b - 1, 0, 0, 0, 0, 0])
            continue
        (i0, (_, r0, s0, _)), (_, (_, r1, _, e1)) = mine[0], mine[-1]
        meta.append([r0, s0 * SB, r1, e1 * SB, idx[i0], 0, 0, 0])
    return meta, ns, lo


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="plan_probe.json")
    ap.add_argument("--cost", type=int, default=5)
    ap.add_argument("--rows", default="all", choices=("all", "fixed"))
    args = ap.parse_args()
    res = []
    for row in plan_rows():
        if row.kind != "anchor" or (args.rows == "fixed" and row.varlen):
            continue
        c = Caller(row.b, row.s_q, row.sk, row.h_q, row.varlen)
        parts = c.md.shape[0]
        nblk = [scheduler.blocks(s) for s in c.lens]
        rec = {"b": row.b, "s_q": row.s_q, "sk": row.sk, "h_q": row.h_q, "varlen": row.varlen,
               "parts": parts, "default_slots": int(c.ns[-1])}
        plans = {"default": (c.md, c.ns)}
        for name, split in (("whole", False), ("greedy", True)):
            meta, ns, cap = build(nblk, parts, args.cost, split)
            plans[name] = (torch.tensor(meta, dtype=torch.int32, device="cuda"),
                           torch.tensor(ns, dtype=torch.int32, device="cuda"))
            rec[f"{name}_slots"], rec[f"{name}_cap"] = ns[-1], cap
        for name, (md, ns) in plans.items():
            c.md, c.ns = md, ns
            status, _, _ = check_output(c)
            rec[f"{name}_check"] = status
            rec[f"{name}_ms"] = time_eager(c) if status == "ok" else None
        res.append(rec)
        d = rec["default_ms"]
        print(f"{row.b} {row.s_q} {row.sk} {row.h_q} {'varlen' if row.varlen else 'fixed'}: "
              f"default {d:.4f} ms ({rec['default_slots']} slots) | whole "
              f"{rec['whole_ms'] and d / rec['whole_ms']:.3f}x ({rec['whole_slots']}) | greedy "
              f"{rec['greedy_ms'] and d / rec['greedy_ms']:.3f}x ({rec['greedy_slots']}) "
              f"{rec['whole_check']} {rec['greedy_check']}", flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
