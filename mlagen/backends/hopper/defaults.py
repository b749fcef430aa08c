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

# Size class -> main loop.  "wgmma" (mla_wgmma.cuh) has fixed knobs, WGMMA_KNOBS, and takes
# page sizes that are multiples of 64 only: other page sizes get the class's mma_sync
# defaults.  wgmma was 2.0-2.2x the 64-row and 1.29x the 32-row mma_sync kernels at b = 128
# (benchmarks/results/hopper_h200.md); the few-rows wgmma kernel (16 rows in wgmma's N) was
# 1.03-1.07x the 16-row mma_sync one on the anchor's 16-row rows at b = 128, equal at b = 8
# (benchmarks/results/hopper_rows_notes.md).  MLAGEN_HOPPER_MAINLOOP (JSON {"class":
# "wgmma" | "mma_sync"}) replaces entries for a run.
MAINLOOP = {16: "wgmma", 32: "wgmma", 64: "wgmma"}
# Size class -> (rows_per_tile, block_kv, buffers, warps) of its wgmma kernel: 64 rows is
# mla_wgmma.cuh, 16 or 32 rows mla_wgmma_rows.cuh (the rows in wgmma's N; warps 8 = two
# consumer warpgroups taking alternate 64-key blocks).  The 32 class: 32 rows with two
# consumer warpgroups was 0.840-0.972 (geomean 0.914) of the best anchor on its 12 anchor
# rows at b = 128 where the padded 64-row kernel was 0.817-0.919 (0.869) and one consumer
# warpgroup 0.770-0.868; for 16 rows one warpgroup stays (1.007 against 0.996 with two)
# (benchmarks/results/hopper_rows2_h200.md).  MLAGEN_HOPPER_WGMMA_KNOBS (JSON {"class":
# [rows_per_tile, block_kv, buffers, warps]}) replaces entries for a run.
WGMMA_KNOBS = {16: (16, 64, 2, 4), 32: (32, 64, 2, 8), 64: (64, 64, 2, 8)}


def size_class(rows_total: int) -> int:
    for r in (16, 32):
        if rows_total <= r:
            return r
    return 64


def _overridden(table: dict, var: str, value) -> dict:
    """A copy of a size-class table with the entries of environment variable `var` (JSON
    {"class": entry}) replacing its own, each entry made by value(class, json entry): how a
    tuning run's choice is tried without editing this file."""
    out = dict(table)
    env = os.environ.get(var)
    if env:
        out.update({int(cls): value(int(cls), v) for cls, v in json.loads(env).items()})
    return out


def tile_knobs() -> dict[int, tuple[int, int, int, int]]:
    """TILE_KNOBS, with MLAGEN_HOPPER_TILE_KNOBS (JSON {"class": [rows_per_tile, block_kv,
    buffers, warps]}, or [block_kv, buffers, warps] for tiles of the class's own rows)
    replacing entries."""
    def value(cls, v):
        v = tuple(int(x) for x in v)
        return v if len(v) == 4 else (cls,) + v
    return _overridden(TILE_KNOBS, "MLAGEN_HOPPER_TILE_KNOBS", value)


def rows_for(rows_total: int) -> int:
    """Query rows per CTA tile of the static default for s_q * h_q packed rows (pages that
    are multiples of 64): wgmma's 64, or the mma_sync class's tile (the smallest that holds
    them, so h_q = 16 does not pad to 64)."""
    return default_schedule(rows_total).mapping.rows_per_tile


def wgmma_knobs() -> dict[int, tuple[int, int, int, int]]:
    """WGMMA_KNOBS, with MLAGEN_HOPPER_WGMMA_KNOBS replacing entries."""
    return _overridden(WGMMA_KNOBS, "MLAGEN_HOPPER_WGMMA_KNOBS",
                       lambda cls, v: tuple(int(x) for x in v))


def mainloops() -> dict[int, str]:
    """MAINLOOP, with MLAGEN_HOPPER_MAINLOOP replacing entries."""
    return _overridden(MAINLOOP, "MLAGEN_HOPPER_MAINLOOP", lambda cls, v: str(v))


def default_schedule(rows_total: int, dtype: str = "bf16", batch: int = 0,
                     gpu: str = "", page_size: int = 64) -> Schedule:
    """The schedule of a shape: what `mlagen tune` measured best for this GPU, batch and
    s_q * h_q (tuned.tuned_knobs: main loop, tile knobs and split cost), else the wgmma
    main loop where MAINLOOP says so and the page size allows it, else the size class's
    TILE_KNOBS."""
    from .tuned import tuned_knobs

    knobs = tuned_knobs(gpu, batch, rows_total) if batch and gpu else None
    if knobs and not (knobs.get("mainloop") == "wgmma" and page_size % 64):
        from mlagen.errors import ScheduleError
        from mlagen.schedule.rules import check

        try:
            s = Schedule.build(name=f"hopper_tuned_{dtype}", target="hopper", dtype=dtype,
                               **knobs)
            check(s)
            return canonical(s)
        except (ScheduleError, TypeError, ValueError):
            pass          # a table from another version's knobs: the static defaults

    cls = size_class(rows_total)
    if mainloops()[cls] == "wgmma" and page_size % 64 == 0:
        rows, block_kv, buffers, warps = wgmma_knobs()[cls]
        return canonical(Schedule.build(name=f"hopper_default_wgmma_{dtype}", target="hopper",
                                        dtype=dtype, rows_per_tile=rows, block_kv=block_kv,
                                        buffers=buffers, warps=warps, mainloop="wgmma"))
    rows, block_kv, buffers, warps = tile_knobs()[cls]
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
