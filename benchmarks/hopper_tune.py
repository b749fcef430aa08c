"""Time the legal Hopper schedules of each tile size on a few rows of the sweep, to pick
defaults.py's TILE_KNOBS.  Builds every candidate first (in parallel), then times each
with do_bench (median, whole call).

    python benchmarks/hopper_tune.py [--out FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("MLAGEN_HOPPER_CHECK_INDICES", "0")

import torch  # noqa: E402

from mlagen.backends.hopper import api, defaults, ops  # noqa: E402
from mlagen.errors import ScheduleError  # noqa: E402
from mlagen.schedule.records import Schedule  # noqa: E402

from hopper_sweep import workload  # noqa: E402

ROWS = [  # (b, s_q, sk, h_q)
    (128, 1, 8192, 16), (128, 1, 8192, 32), (128, 1, 8192, 64), (128, 1, 8192, 128),
    (32, 1, 1024, 128),
]


def candidates(rows: int) -> list[Schedule]:
    out = []
    for bkv, buf, warps in itertools.product((16, 32, 64), (2, 3), (4, 8)):
        try:
            out.append(defaults.canonical(Schedule.build(
                target="hopper", rows_per_tile=rows, block_kv=bkv, buffers=buf, warps=warps)))
        except ScheduleError:
            pass
    return out


def main():
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--best", default=None,
                    help="write the fastest knobs per tile size (the first row timed for that "
                         "size) as MLAGEN_HOPPER_TILE_KNOBS JSON")
    args = ap.parse_args()
    cands = {r: candidates(r) for r in (16, 32, 64)}
    allc = [s for v in cands.values() for s in v]
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(ops.library, allc))
    results, best = [], {}
    for b, s_q, sk, h_q in ROWS:
        q, k, bt, seqlens, lens = workload(b, s_q, sk, h_q, False)
        rows = defaults.rows_for(s_q * h_q)
        timed = []
        for s in cands[rows]:
            def call(s=s):
                md, ns = api.get_mla_metadata(seqlens, s_q * h_q, 1, schedule=s)
                return api.flash_mla_with_kvcache(q, k, bt, seqlens, 512, md, ns, causal=True,
                                                  schedule=s)
            call()
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(call, warmup=10, rep=50, return_mode="median")
            m = s.mapping
            timed.append((ms, f"r{m.rows_per_tile} bkv{m.block_kv} buf{m.buffers} w{m.warps}",
                          [m.block_kv, m.buffers, m.warps]))
            results.append(dict(b=b, s_q=s_q, sk=sk, h_q=h_q, schedule=timed[-1][1], ms=ms))
        timed.sort(key=lambda x: x[0])
        best.setdefault(str(rows), timed[0][2])
        print(f"b={b} s_q={s_q} sk={sk} h_q={h_q}: " +
              ", ".join(f"{n} {ms:.4f}" for ms, n, _ in timed), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    if args.best:
        Path(args.best).write_text(json.dumps(best))
    print("best:", json.dumps(best))


if __name__ == "__main__":
    main()
