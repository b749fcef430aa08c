"""The default Hopper schedule for a shape, and the canonical schedule a library is built
from.  The kernel library depends only on dtype, rows_per_tile, block_kv, buffers and warps
(heads, s_q and page size are run-time arguments), so every shape that shares those knobs
shares one build."""

from __future__ import annotations

import dataclasses
import json
import os

from mlagen.schedule.records import Schedule

# Size class of s_q * h_q packed rows (<= 16, <= 32, more) -> (rows_per_tile, block_kv,
# buffers, warps).  A class may use smaller tiles than its rows (several row tiles per part,
# reading the same keys through L2).  Picked with benchmarks/hopper_tune.py on the lent H200
# (benchmarks/results/hopper_h200.md).
TILE_KNOBS = {16: (16, 32, 2, 8), 32: (32, 64, 2, 8), 64: (64, 32, 3, 8)}


def size_class(rows_total: int) -> int:
    for r in (16, 32):
        if rows_total <= r:
            return r
    return 64


def tile_knobs() -> dict[int, tuple[int, int, int, int]]:
    """TILE_KNOBS, with MLAGEN_HOPPER_TILE_KNOBS (JSON {"class": [rows_per_tile, block_kv,
    buffers, warps]}, or [block_kv, buffers, warps] for tiles of the class's own rows)
    replacing entries: how a tuning run's choice is tried without editing this file."""
    knobs = dict(TILE_KNOBS)
    env = os.environ.get("MLAGEN_HOPPER_TILE_KNOBS")
    if env:
        for cls, v in json.loads(env).items():
            v = tuple(int(x) for x in v)
            knobs[int(cls)] = v if len(v) == 4 else (int(cls),) + v
    return knobs


def rows_for(rows_total: int) -> int:
    """Query rows per CTA tile for s_q * h_q packed rows: by default the smallest tile that
    holds them (so h_q = 16 does not pad to 64), else 64."""
    return tile_knobs()[size_class(rows_total)][0]


def default_schedule(rows_total: int, dtype: str = "bf16", batch: int = 0,
                     gpu: str = "") -> Schedule:
    """The schedule of a shape: what `mlagen tune` measured best for this GPU, batch and
    s_q * h_q (tune.tuned_knobs), else the size class's TILE_KNOBS."""
    from .tuned import tuned_knobs

    knobs = tuned_knobs(gpu, batch, rows_total) if batch and gpu else None
    if knobs:
        from mlagen.errors import ScheduleError
        from mlagen.schedule.rules import check

        try:
            s = Schedule.build(name=f"hopper_tuned_{dtype}", target="hopper", dtype=dtype,
                               **knobs)
            check(s)
            return canonical(s)
        except (ScheduleError, TypeError, ValueError):
            pass          # a table from another version's knobs: the static defaults
    rows, block_kv, buffers, warps = tile_knobs()[size_class(rows_total)]
    return canonical(Schedule.build(name=f"hopper_default_r{rows}_{dtype}", target="hopper",
                                    dtype=dtype, rows_per_tile=rows, block_kv=block_kv,
                                    buffers=buffers, warps=warps))


def canonical(s: Schedule) -> Schedule:
    """The schedule a library is built from: the problem fields that are run-time arguments
    set to fixed values (every knob kept as it is), so that one build serves every head
    count, s_q and page size."""
    from mlagen.schedule.rules import plan_of

    c = s.replace(heads=128, tp=1, page_size=64, max_s_q=8)
    c = dataclasses.replace(c, name=c.variant_name(), source=None)
    plan_of(c)           # checked (page_size 64 must still suit block_kv)
    return c
