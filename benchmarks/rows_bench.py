"""The few-rows wgmma kernel (mla_wgmma_rows.cuh: query rows in wgmma's N) beside the API's
current default on the anchor rows with s_q * h_q <= 32 (the anchor's exact workloads through
mlagen/backends/hopper/bench.py: each output checked against the reference before timing,
eager do_bench median).

    python benchmarks/rows_bench.py small          NaN-poisoned cases against the reference
                                                   (also the compute-sanitizer case)
    python benchmarks/rows_bench.py time [--out FILE] [--kernels]
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


def rows_kernel(rows, dtype="bf16"):
    return Schedule.build(target="hopper", mainloop="wgmma", rows_per_tile=rows, block_kv=64,
                          buffers=2, warps=4, dtype=dtype)


def small():
    from test_hopper_gpu import check, inputs
    for rows in (16, 32):
        for sharp in (False, True):
            check(inputs(3, [65, 1000, 130], 2, 16, 64, seed=1, sharp=sharp), True,
                  rows_kernel(rows))
            check(inputs(2, [0, 4097], 1, 8, 128, dtype="fp16", seed=2, sharp=sharp), False,
                  rows_kernel(rows, "fp16"))
        print(f"small r{rows}: ok", flush=True)


def time_rows(out_file, kernels):
    from mlagen.backends.hopper import bench

    modes = ("eager", "kernels") if kernels else ("eager",)
    res = []
    for row in bench.plan_rows():
        if row.kind != "anchor" or row.s_q * row.h_q > 32:
            continue
        line = [row.label()]
        for name, sched in (("default", None), ("r16", rows_kernel(16)),
                            ("r32", rows_kernel(32))):
            r = bench.measure_row(bench.Row(**{k: getattr(row, k) for k in (
                "b", "s_q", "sk", "h_q", "varlen", "kind", "anchor_ms", "anchor_by",
                "flashmla_ms")}), sched, modes)
            d = asdict(r)
            d["config"] = name
            res.append(d)
            line.append(f"{name} {r.check} {r.eager_ms or float('nan'):.4f} ms "
                        f"{(r.gbps or 0):.0f} GB/s ratio {r.ratio or float('nan'):.3f}"
                        f"{' ' + r.error if r.error else ''}")
        print(" | ".join(line), flush=True)
    if out_file:
        Path(out_file).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("small", "time"))
    ap.add_argument("--out")
    ap.add_argument("--kernels", action="store_true")
    a = ap.parse_args()
    small() if a.what == "small" else time_rows(a.out, a.kernels)
