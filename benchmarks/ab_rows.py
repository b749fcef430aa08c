"""A/B timing of the bench of record's rows for the tree on PYTHONPATH (GPU only).

    python benchmarks/ab_rows.py OUT.json [--set compute|class32|all]   measure, save
    python benchmarks/ab_rows.py --compare A.json B.json        the table, B/A per row

Each row through bench.measure_row (output checked against the reference first, then
eager do_bench median; graph rows in graph mode): the anchor's exact workloads.  Run one
process per tree, one after the other in the same visit.
"""
from __future__ import annotations

import dataclasses
import json
import sys

# (b, s_q, sk, h_q, varlen) of the bench of record's anchor rows timed by --set compute
COMPUTE = [(128, 1, 8192, 128, False), (128, 1, 4096, 128, False), (128, 2, 8192, 64, False),
           (128, 1, 16384, 128, False), (128, 1, 8192, 64, False), (128, 1, 8192, 16, False),
           (128, 1, 8192, 16, True), (128, 1, 8192, 32, False), (128, 2, 4096, 16, True)]


def measure(out: str, which: str) -> None:
    from mlagen.backends.hopper import bench
    rows = bench.plan_rows()
    if which == "compute":
        rows = [r for r in rows if r.kind == "graph" or
                (r.b, r.s_q, r.sk, r.h_q, r.varlen) in COMPUTE]
    elif which == "class32":   # the anchor rows with 17-32 packed query rows
        rows = [r for r in rows if r.kind == "anchor" and 16 < r.s_q * r.h_q <= 32]
    res = []
    for r in rows:
        modes = ("graph",) if r.kind == "graph" else ("eager",)
        r = bench.measure_row(r, modes=modes)
        res.append(dataclasses.asdict(r))
        t = r.graph_ms if r.kind == "graph" else r.eager_ms
        print(r.label(), r.variant, r.check, t, r.error, flush=True)
    json.dump(res, open(out, "w"), indent=1)


def compare(a: str, b: str) -> None:
    A, B = json.load(open(a)), json.load(open(b))
    print("| row | kind | A ms | B ms | A/B | B vs anchor |")
    print("|---|---|---|---|---|---|")
    for x, y in zip(A, B):
        key = "graph_ms" if x["kind"] == "graph" else "eager_ms"
        ta, tb = x[key], y[key]
        if not ta or not tb:
            print(f"| {x['b']} {x['s_q']} {x['sk']} {x['h_q']} {'varlen' if x['varlen'] else ''} "
                  f"| {x['kind']} | {ta} | {tb} | - | {y['check']} {y['error']} |")
            continue
        anc = (y["flashmla_graph_us"] / 1e3) if x["kind"] == "graph" else y["anchor_ms"]
        print(f"| {x['b']} {x['s_q']} {x['sk']} {x['h_q']} {'varlen' if x['varlen'] else ''} "
              f"| {x['kind']} | {ta:.4f} | {tb:.4f} | {ta / tb:.3f} | {anc / tb:.3f} |")


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        measure(sys.argv[1], sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--set"
                else "compute")
