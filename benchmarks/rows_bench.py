"""The few-rows wgmma kernel (mla_wgmma_rows.cuh: query rows in wgmma's N) beside the API's
current default on the anchor rows with s_q * h_q <= 32 (the anchor's exact workloads through
mlagen/backends/hopper/bench.py: each output checked against the reference before timing,
eager do_bench median).

    python benchmarks/rows_bench.py small [--warps 4,8] [--quick]   NaN-poisoned cases
                                                   against the reference (--quick: the
                                                   compute-sanitizer case)
    python benchmarks/rows_bench.py time [--out FILE] [--kernels] [--warps 4,8] [--budget S]
                                                   [--default]

warps = 4: one consumer warpgroup; 8: two taking alternate 64-key blocks.  `time` measures
the 16-row rows with r16 and the 32-row rows with r32, each with every --warps value (and
with --default the API's default), in one process, then prints each configuration's ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))
os.environ.setdefault("MLAGEN_HOPPER_CHECK_INDICES", "0")

from mlagen.schedule.records import Schedule  # noqa: E402


def rows_kernel(rows, dtype="bf16", warps=4, **kw):
    return Schedule.build(target="hopper", mainloop="wgmma", rows_per_tile=rows, block_kv=64,
                          buffers=2, warps=warps, dtype=dtype, **kw)


def small(warps, quick=False):
    """quick (the compute-sanitizer runs): sharp data only."""
    from test_hopper_gpu import check, inputs
    for w in warps:
        for rows in (16, 32):
            for sharp in (True,) if quick else (False, True):
                check(inputs(3, [65, 1000, 130], 2, 16, 64, seed=1, sharp=sharp), True,
                      rows_kernel(rows, warps=w))
                check(inputs(2, [0, 4097], 1, 8, 128, dtype="fp16", seed=2, sharp=sharp), False,
                      rows_kernel(rows, "fp16", w))
                # whole requests of 3, 2, 1 and 0 blocks (odd counts: WG1 one short or idle)
                check(inputs(4, [129, 65, 1, 0], 1, 16, 64, seed=3, sharp=sharp), True,
                      rows_kernel(rows, warps=w, split_kv=1))
            print(f"small r{rows} w{w}: ok", flush=True)


def configs(rows_total, warps, default=False):
    """(name, schedule) of a row: 16 rows on r16; 32 rows on r32 (r16 would read the keys
    twice: 0.52-0.60 of the anchor, measured), and with default the API's default too (the
    64-row kernel padded for 32 rows; r16w4 for 16 rows)."""
    out = [("default", None)] if default else []
    r = 16 if rows_total <= 16 else 32
    return out + [(f"r{r}w{w}", rows_kernel(r, warps=w)) for w in warps]


def time_rows(out_file, kernels, warps, budget_s, default=False):
    """Rows in order of interest (16 rows first, s_k = 8192 first); no new row starts past
    budget_s seconds, so the table below is printed within a visit's time box."""
    import math
    import time

    from mlagen.backends.hopper import bench

    modes = ("eager", "kernels") if kernels else ("eager",)
    res = []
    rows = [r for r in bench.plan_rows() if r.kind == "anchor" and r.s_q * r.h_q <= 32]
    rows.sort(key=lambda r: (r.s_q * r.h_q, r.sk != 8192, r.b != 128, r.varlen, r.sk))
    t_start = time.time()
    for row in rows:
        if time.time() - t_start > budget_s:
            print(f"budget of {budget_s} s spent: {row.label()} and later rows not timed",
                  flush=True)
            break
        line = [row.label()]
        for name, sched in configs(row.s_q * row.h_q, warps, default):
            r = bench.measure_row(bench.Row(**{k: getattr(row, k) for k in (
                "b", "s_q", "sk", "h_q", "varlen", "kind", "anchor_ms", "anchor_by",
                "flashmla_ms")}), sched, modes)
            d = asdict(r)
            d["config"] = name
            d["rows_total"] = row.s_q * row.h_q
            res.append(d)
            line.append(f"{name} {r.check} {r.eager_ms or float('nan'):.4f} ms "
                        f"{(r.gbps or 0):.0f} GB/s ratio {r.ratio or float('nan'):.3f}"
                        f"{' ' + r.error if r.error else ''}")
        print(" | ".join(line), flush=True)
    if out_file:
        Path(out_file).write_text(json.dumps(res, indent=1))
    print("\n| rows | config | rows timed | ratio min-max | geomean | TB/s min-max |")
    print("|---|---|---|---|---|---|")
    for rows_total in (16, 32):
        for name, _ in configs(rows_total, warps, default):
            got = [d for d in res if d["config"] == name and d["rows_total"] == rows_total
                   and d["ratio"]]
            if not got:
                print(f"| {rows_total} | {name} | 0 | - | - | - |")
                continue
            rs = [d["ratio"] for d in got]
            tb = [d["gbps"] / 1000 for d in got]
            gm = math.exp(sum(math.log(x) for x in rs) / len(rs))
            print(f"| {rows_total} | {name} | {len(rs)} | {min(rs):.3f}-{max(rs):.3f} | "
                  f"{gm:.3f} | {min(tb):.2f}-{max(tb):.2f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("small", "time"))
    ap.add_argument("--out")
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--quick", action="store_true", help="small: sharp data only")
    ap.add_argument("--default", action="store_true", help="time: the API default too")
    ap.add_argument("--budget", type=float, default=1e9,
                    help="time: seconds after which no new row starts")
    ap.add_argument("--warps", default="4,8", help="consumer warps of the few-rows kernel")
    a = ap.parse_args()
    w = [int(x) for x in a.warps.split(",")]
    small(w, a.quick) if a.what == "small" else time_rows(a.out, a.kernels, w, a.budget, a.default)
