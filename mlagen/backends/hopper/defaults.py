"""The default Hopper schedule for a shape, and the canonical schedule a library is built
from.  The kernel library depends only on dtype, rows_per_tile, block_kv, buffers and warps
(heads, s_q and page size are run-time arguments), so every shape that shares those knobs
shares one build."""

from __future__ import annotations

import json
import os

from mlagen.schedule.records import Schedule

# rows_per_tile -> (block_kv, buffers, warps): the largest K pipeline that fits beside Q in
# 227 KiB (see mlagen.schedule.resources.hopper_smem), 8 warps to keep loads in flight.
# Picked with benchmarks/hopper_tune.py on the lent H200 (benchmarks/results/hopper_h200.md).
TILE_KNOBS = {16: (32, 2, 8), 32: (64, 2, 8), 64: (32, 3, 8)}


def tile_knobs() -> dict[int, tuple[int, int, int]]:
    """TILE_KNOBS, with MLAGEN_HOPPER_TILE_KNOBS (JSON {"rows": [block_kv, buffers, warps]})
    replacing entries: how a tuning run's choice is tried without editing this file."""
    knobs = dict(TILE_KNOBS)
    env = os.environ.get("MLAGEN_HOPPER_TILE_KNOBS")
    if env:
        for rows, v in json.loads(env).items():
            knobs[int(rows)] = tuple(int(x) for x in v)
    return knobs


def rows_for(rows_total: int) -> int:
    """Query rows per CTA tile for s_q * h_q packed rows: the smallest tile that holds them
    (so h_q = 16 does not pad to 64), else 64."""
    for r in (16, 32):
        if rows_total <= r:
            return r
    return 64


def default_schedule(rows_total: int, dtype: str = "bf16") -> Schedule:
    rows = rows_for(rows_total)
    block_kv, buffers, warps = tile_knobs()[rows]
    return canonical(Schedule.build(name=f"hopper_default_r{rows}_{dtype}", target="hopper",
                                    dtype=dtype, rows_per_tile=rows, block_kv=block_kv,
                                    buffers=buffers, warps=warps))


def canonical(s: Schedule) -> Schedule:
    """The schedule a library is built from: problem fields that are run-time arguments set
    to fixed values, so that one build serves every head count, s_q and page size."""
    m = s.mapping
    return Schedule.build(name=f"hopper_{s.problem.dtype}_r{m.rows_per_tile}_bkv{m.block_kv}"
                               f"_buf{m.buffers}_w{m.warps}",
                          target="hopper", heads=128, page_size=64, max_s_q=8,
                          dtype=s.problem.dtype, rows_per_tile=m.rows_per_tile,
                          block_kv=m.block_kv, buffers=m.buffers, warps=m.warps,
                          mainloop=m.mainloop, split_kv=m.split_kv)
