"""Time the legal Hopper schedules of each tile size on a few rows of the sweep, to pick
defaults.py's TILE_KNOBS.  Builds every candidate first (in parallel), then times each
with do_bench (median, whole call).

    python benchmarks/hopper_tune.py [--out FILE] [--best FILE] [--cands SPEC]

--cands "16:16,32,2,8 16:16,32,5,8 32:16,32,5,8" times only those (class:rows,bkv,buf,warps)
candidates, each on its class's rows; without it every legal schedule of each class's own
tile size is timed.  --best writes the fastest per class (geometric mean over its rows) as
MLAGEN_HOPPER_TILE_KNOBS JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

from mlagen.backends.hopper import api, defaults, ops  # noqa: E402
from mlagen.errors import ScheduleError  # noqa: E402
from mlagen.schedule.records import Schedule  # noqa: E402

from hopper_sweep import workload  # noqa: E402

ROWS = [  # (b, s_q, sk, h_q)
    (128, 1, 8192, 16), (128, 1, 4096, 16), (128, 1, 8192, 32), (128, 1, 8192, 64),
    (128, 1, 8192, 128), (32, 1, 1024, 128), (1, 1, 32768, 128), (8, 1, 8192, 16),
]


def size_class(rows_total: int) -> int:
    """defaults.size_class (kept here so this script also times older trees)."""
    return 16 if rows_total <= 16 else (32 if rows_total <= 32 else 64)


def _schedule(rows, bkv, buf, warps):
    return defaults.canonical(Schedule.build(target="hopper", rows_per_tile=rows, block_kv=bkv,
                                             buffers=buf, warps=warps))


def candidates(spec: str | None) -> dict[int, list[Schedule]]:
    out: dict[int, list[Schedule]] = {16: [], 32: [], 64: []}
    if spec:
        for item in spec.split():
            cls, knobs = item.split(":")
            out[int(cls)].append(_schedule(*(int(x) for x in knobs.split(","))))
        return out
    for rows in out:
        for bkv, buf, warps in itertools.product((16, 32, 64), (2, 3, 4, 5), (4, 8)):
            try:
                out[rows].append(_schedule(rows, bkv, buf, warps))
            except ScheduleError:
                pass
    return out


def main():
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--best", default=None,
                    help="write the fastest knobs per size class (geometric mean over its rows) "
                         "as MLAGEN_HOPPER_TILE_KNOBS JSON")
    ap.add_argument("--cands", default=None, help="class:rows,bkv,buf,warps ... (see above)")
    args = ap.parse_args()
    cands = candidates(args.cands)
    allc = [s for v in cands.values() for s in v]
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(ops.library, allc))
    results, score = [], {}   # score[class][knobs]: sum of log times over the class's rows
    for b, s_q, sk, h_q in ROWS:
        cls = size_class(s_q * h_q)
        if not cands[cls]:
            continue
        q, k, bt, seqlens, lens = workload(b, s_q, sk, h_q, False)
        timed = []
        for s in cands[cls]:
            md, ns = api.get_mla_metadata(seqlens, s_q * h_q, 1, schedule=s)

            def call(s=s, md=md, ns=ns):   # timed as the sweep: metadata outside
                return api.flash_mla_with_kvcache(q, k, bt, seqlens, 512, md, ns, causal=True,
                                                  schedule=s)
            call()
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(call, warmup=10, rep=50, return_mode="median")
            m = s.mapping
            knobs = [m.rows_per_tile, m.block_kv, m.buffers, m.warps]
            name = f"r{m.rows_per_tile} bkv{m.block_kv} buf{m.buffers} w{m.warps}"
            timed.append((ms, name, knobs))
            results.append(dict(b=b, s_q=s_q, sk=sk, h_q=h_q, schedule=name, ms=ms))
        for ms, _, knobs in timed:
            acc = score.setdefault(cls, {})
            acc[tuple(knobs)] = acc.get(tuple(knobs), 0.0) + math.log(ms)
        timed.sort(key=lambda x: x[0])
        print(f"b={b} s_q={s_q} sk={sk} h_q={h_q}: " +
              ", ".join(f"{n} {ms:.4f}" for ms, n, _ in timed), flush=True)
        del q, k, bt
    # the fastest per class over all its rows (geometric mean)
    best = {str(c): list(min(v, key=v.get)) for c, v in score.items()}
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    if args.best:
        Path(args.best).write_text(json.dumps(best))
    print("best:", json.dumps(best))


if __name__ == "__main__":
    main()
