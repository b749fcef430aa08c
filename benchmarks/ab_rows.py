"""A/B timing of the bench of record's rows for the tree on PYTHONPATH (GPU only).

    python benchmarks/ab_rows.py OUT.json [--set SET]   measure; SET: compute, class32, fewrows,
        few, graph, page16, memory or all
    python benchmarks/ab_rows.py --compare A.json B.json [C.json ...]   the table, A/B, A/C per row

An argument of --compare may list several files joined by commas (one tree timed in several
rounds, the trees alternating): each row's time is then the median over them.

Each row through bench.measure_row (output checked against the reference first, then
eager do_bench median; graph rows in graph mode): the anchor's exact workloads.  Run one
process per tree, one after the other in the same visit.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import sys

# (b, s_q, sk, h_q, varlen) of the bench of record's anchor rows timed by --set compute
COMPUTE = [(128, 1, 8192, 128, False), (128, 1, 4096, 128, False), (128, 2, 8192, 64, False),
           (128, 1, 16384, 128, False), (128, 1, 8192, 64, False), (128, 1, 8192, 16, False),
           (128, 1, 8192, 16, True), (128, 1, 8192, 32, False), (128, 2, 4096, 16, True)]


# (b, s_q, sk, h_q, varlen) timed by --set page16: two row tiles (where a part's CTAs share
# K), and one-tile controls
PAGE16 = [(128, 1, 8192, 128, False), (128, 1, 4096, 128, False), (128, 2, 4096, 64, False),
          (32, 1, 1024, 128, False), (128, 1, 8192, 16, False), (128, 1, 8192, 64, False)]


def measure(out: str, which: str) -> None:
    from mlagen.backends.hopper import bench
    rows = bench.plan_rows()
    if which == "compute":
        rows = [r for r in rows if r.kind == "graph" or
                (r.b, r.s_q, r.sk, r.h_q, r.varlen) in COMPUTE]
    elif which == "graph":
        rows = [r for r in rows if r.kind == "graph"]
    elif which == "class32":   # the anchor rows with 17-32 packed query rows
        rows = [r for r in rows if r.kind == "anchor" and 16 < r.s_q * r.h_q <= 32]
    elif which == "fewrows":   # the anchor rows with at most 32 packed query rows
        rows = [r for r in rows if r.kind == "anchor" and r.s_q * r.h_q <= 32]
    elif which == "few":       # fewrows' fixed-length rows (FA3's anchor rows)
        rows = [r for r in rows if r.kind == "anchor" and not r.varlen and r.s_q * r.h_q <= 32]
    elif which == "memory":    # the fixed-length rows of s_q*h_q <= 64 (FA3's anchor rows)
        rows = [r for r in rows if r.kind == "anchor" and not r.varlen and r.s_q * r.h_q <= 64]
    elif which == "page16":    # the anchor's recipe at 16-token pages (the mma_sync kernel)
        rows = [bench.Row(*shape, "page16", page=16) for shape in PAGE16]
    res = []
    for r in rows:
        modes = ("graph",) if r.kind == "graph" else ("eager",)
        r = bench.measure_row(r, modes=modes)
        res.append(dataclasses.asdict(r))
        t = r.graph_ms if r.kind == "graph" else r.eager_ms
        print(r.label(), r.variant, r.check, t, r.error, flush=True)
    json.dump(res, open(out, "w"), indent=1)


def load(arg: str) -> list[dict]:
    """The rows of one file, or of several (comma-joined) with each time the median."""
    runs = [json.load(open(f)) for f in arg.split(",")]
    rows = runs[0]
    for i, r in enumerate(rows):
        for key in ("graph_ms", "eager_ms"):
            ts = [run[i][key] for run in runs if run[i][key]]
            r[key] = statistics.median(ts) if ts else r[key]
    return rows


def compare(a: str, *others: str) -> None:
    """One line per row: A's time, then each other tree's time and A/that (>1: that tree is
    faster), and the last tree's ratio to the anchor."""
    A = load(a)
    Ts = [load(o) for o in others]
    names = " | ".join(f"T{i + 1} ms | A/T{i + 1}" for i in range(len(Ts)))
    print(f"| row | kind | A ms | {names} | last vs anchor |")
    print("|---|---|---|" + "---|---|" * len(Ts) + "---|")
    for i, x in enumerate(A):
        row = f"| {x['b']} {x['s_q']} {x['sk']} {x['h_q']} {'varlen' if x['varlen'] else ''} "
        key = "graph_ms" if x["kind"] == "graph" else "eager_ms"
        ys = [T[i] for T in Ts]
        cells = []
        for y in ys:
            assert (y["b"], y["s_q"], y["sk"], y["h_q"], y["varlen"], y["kind"]) == \
                (x["b"], x["s_q"], x["sk"], x["h_q"], x["varlen"], x["kind"]), "rows differ"
            t = y[key]
            cells.append(f"{t:.4f} | {x[key] / t:.3f}" if t and x[key]
                         else f"{t} | - ({y['check']} {y['error']})")
        last = ys[-1]
        anc = (last["flashmla_graph_us"] / 1e3) if x["kind"] == "graph" else last["anchor_ms"]
        vs = f"{anc / last[key]:.3f}" if last[key] and anc else "-"
        ta = f"{x[key]:.4f}" if x[key] else f"{x[key]} ({x['check']} {x['error']})"
        print(f"{row}| {x['kind']} | {ta} | {' | '.join(cells)} | {vs} |")


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(*sys.argv[2:])
    else:
        measure(sys.argv[1], sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--set"
                else "compute")
