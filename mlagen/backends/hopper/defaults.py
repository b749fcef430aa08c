"""The default Hopper schedule for a shape, and the canonical schedule a library is built
from.  The kernel library depends only on dtype, rows_per_tile, block_kv, buffers and warps
(heads, s_q and page size are run-time arguments), so every shape that shares those knobs
shares one build."""

from __future__ import annotations

import dataclasses
import json
import os

from mlagen.schedule.records import Schedule

from .knobs import MAINLOOPS, gathers_keys

# Size class of s_q * h_q packed rows (<= 16, <= 32, more) -> (rows_per_tile, block_kv,
# buffers, warps).  A class may use smaller tiles than its rows (several row tiles per part,
# reading the same keys through L2).  Picked with 5569878:benchmarks/hopper_tune.py on the lent H200
# (5569878:benchmarks/results/hopper_h200.md).
TILE_KNOBS = {16: (16, 32, 2, 8), 32: (32, 64, 2, 8), 64: (64, 32, 3, 8)}

# Size class -> main loop.  "wgmma" (mla_wgmma.cuh) has fixed knobs, WGMMA_KNOBS, and takes
# page sizes that are multiples of 64 only: other page sizes get the class's mma_sync
# defaults.  wgmma was 2.0-2.2x the 64-row and 1.29x the 32-row mma_sync kernels at b = 128
# (5569878:benchmarks/results/hopper_h200.md); the few-rows wgmma kernel (16 rows in wgmma's N) was
# 1.03-1.07x the 16-row mma_sync one on the anchor's 16-row rows at b = 128, equal at b = 8
# (5569878:benchmarks/results/hopper_rows_notes.md).  MLAGEN_HOPPER_MAINLOOP (JSON {"class":
# "wgmma" | "mma_sync"}) replaces entries for a run.
MAINLOOP = {16: "wgmma", 32: "wgmma", 64: "wgmma"}
# Size class -> (rows_per_tile, block_kv, buffers, warps) of its wgmma kernel: 64 rows is
# mla_wgmma.cuh, 16 or 32 rows mla_wgmma_rows.cuh (the rows in wgmma's N; warps 8 = two
# consumer warpgroups taking alternate 64-key blocks).  The 32 class: 32 rows with two
# consumer warpgroups was 0.840-0.972 (geomean 0.914) of the best anchor on its 12 anchor
# rows at b = 128 where the padded 64-row kernel was 0.817-0.919 (0.869) and one consumer
# warpgroup 0.770-0.868; for 16 rows one warpgroup stays (1.007 against 0.996 with two)
# (5569878:benchmarks/results/hopper_rows2_h200.md).  Since then the 64-row kernel gained its slice
# barriers, overlap and conditional rescale: padded to 64 rows it is now 0.3-2.4 % faster
# than the 32-row kernel on all 12 rows of the class (class32_visit.sh at 6965537,
# 5569878:benchmarks/results/hopper_class32_h200.md), so the class runs it.
# MLAGEN_HOPPER_WGMMA_KNOBS (JSON {"class": [rows_per_tile, block_kv, buffers, warps]})
# replaces entries for a run.
WGMMA_KNOBS = {16: (16, 64, 2, 4), 32: (64, 64, 2, 8), 64: (64, 64, 2, 8)}


def size_class(rows_total: int) -> int:
    for r in (16, 32):
        if rows_total <= r:
            return r
    return 64


def _overridden(table: dict, var: str, value) -> dict:
    """A copy of a size-class table with the entries of environment variable `var` (JSON
    {"class": entry}) replacing its own, each entry made by value(class, json entry): how a
    tuning run's choice is tried without editing this file.  A malformed value is a
    ScheduleError naming the variable (one line at the command line, not a traceback)."""
    out = dict(table)
    env = os.environ.get(var)
    if not env:
        return out
    try:
        entries = json.loads(env)
    except json.JSONDecodeError as e:
        raise _bad(var, f"{env!r} is not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(entries, dict):
        raise _bad(var, f"{env!r} must be a JSON object {{\"class\": entry}}")
    for key, v in entries.items():
        if key not in {str(c) for c in table}:
            raise _bad(var, f"class {json.dumps(key)} must be one of "
                            + ", ".join(f'"{c}"' for c in sorted(table)))
        out[int(key)] = value(int(key), v)
    return out


def _bad(var: str, message: str):
    """The error of a malformed override: its variable stands where a schedule's file would."""
    from mlagen.errors import ScheduleError

    return ScheduleError(message, file=var)


def _knobs(var: str, cls: int, v, lengths: tuple, what: str, mainloop: str):
    """A JSON entry of integer knobs, checked: a list of one of `lengths` integers (the
    shorter form without rows_per_tile, which is then the class's own rows), legal as a
    schedule of `mainloop`."""
    from mlagen.errors import ScheduleError

    if not (isinstance(v, list) and len(v) in lengths
            and all(isinstance(x, int) and not isinstance(x, bool) for x in v)):
        raise _bad(var, f"class \"{cls}\": {json.dumps(v)} must be {what}")
    v = tuple(v) if len(v) == 4 else (cls,) + tuple(v)
    rows, block_kv, buffers, warps = v
    try:
        canonical(Schedule.build(target="hopper", rows_per_tile=rows, block_kv=block_kv,
                                 buffers=buffers, warps=warps, mainloop=mainloop))
    except ScheduleError as e:
        raise _bad(var, f"class \"{cls}\": {json.dumps(list(v))} is not a legal {mainloop} "
                        f"schedule ({e.message})") from None
    return v


def tile_knobs() -> dict[int, tuple[int, int, int, int]]:
    """TILE_KNOBS, with MLAGEN_HOPPER_TILE_KNOBS (JSON {"class": [rows_per_tile, block_kv,
    buffers, warps]}, or [block_kv, buffers, warps] for tiles of the class's own rows)
    replacing entries."""
    var = "MLAGEN_HOPPER_TILE_KNOBS"
    return _overridden(TILE_KNOBS, var, lambda cls, v: _knobs(
        var, cls, v, (3, 4), "[rows_per_tile, block_kv, buffers, warps] or [block_kv, "
        "buffers, warps] (integers)", "mma_sync"))


def rows_for(rows_total: int) -> int:
    """Query rows per CTA tile of the static default for s_q * h_q packed rows (pages that
    are multiples of 64): wgmma's 64, or the mma_sync class's tile (the smallest that holds
    them, so h_q = 16 does not pad to 64)."""
    return default_schedule(rows_total).mapping.rows_per_tile


def wgmma_knobs() -> dict[int, tuple[int, int, int, int]]:
    """WGMMA_KNOBS, with MLAGEN_HOPPER_WGMMA_KNOBS replacing entries."""
    var = "MLAGEN_HOPPER_WGMMA_KNOBS"
    return _overridden(WGMMA_KNOBS, var, lambda cls, v: _knobs(
        var, cls, v, (4,), "[rows_per_tile, block_kv, buffers, warps] (integers)", "wgmma"))


def mainloops() -> dict[int, str]:
    """MAINLOOP, with MLAGEN_HOPPER_MAINLOOP replacing entries."""
    var = "MLAGEN_HOPPER_MAINLOOP"

    def value(cls, v):
        if v not in MAINLOOPS:
            raise _bad(var, f"class \"{cls}\": {json.dumps(v)} must be "
                            + " or ".join(f'"{m}"' for m in MAINLOOPS))
        return v
    return _overridden(MAINLOOP, var, value)


def cluster_switch() -> bool:
    """MLAGEN_HOPPER_CLUSTER: "0" launches no thread-block clusters (the 64-row wgmma
    kernel's cluster merge and its sparse h_q 128 crossover off; the library reads it once
    per process), "1" or unset the
    default.  Another value is a ScheduleError naming the variable, not a silent default."""
    v = os.environ.get("MLAGEN_HOPPER_CLUSTER")
    if v is None or v in ("0", "1"):
        return v != "0"
    raise _bad("MLAGEN_HOPPER_CLUSTER", f"{v!r} must be 0 (no thread-block clusters) or 1 "
                                        "(the default)")


def check_overrides() -> None:
    """Read the three tables' environment overrides and the cluster switch, so that a
    command refuses a malformed one (ScheduleError) before it builds or measures anything."""
    tile_knobs(), wgmma_knobs(), mainloops(), cluster_switch()


# 8-bit KV caches (kv_format fp8_*): the few-rows wgmma kernel with its converter warpgroup
# up to 16 rows (16-row tiles) and 32 (32-row tiles); beyond, the 64-row kernel, whose
# producer warpgroup converts in its K stages (32-row tiles there read and convert each key
# once a tile, 4 times a token at h_q 128).  Pages not a multiple of 64 go to the 64-row
# kernel too (it gathers key by key; the few-rows kernel's TMA boxes are 64 keys of a page).
FP8_KNOBS = {16: (16, 64, 2, 4), 32: (32, 64, 2, 4), 64: (64, 64, 2, 8)}
# fp8_e4m3 up to 16 rows at batch >= FP8_REGS_BATCH: no converter, two consumer warpgroups
# converting in registers (mla_fp8_regs.cuh), four raw blocks in flight.  On an H100 at b
# 128, s_k 8192, h_q 16 it took 244 us against the converter's 333 (bf16: 428); at b 1-8,
# where a part holds a block or two, a block's longer chain made it 1.1-1.2x slower.
FP8_REGS_BATCH = 16
FP8_REGS = dict(warps=8, fp8_converters=0, fp8_raw_slots=4)


def default_schedule(rows_total: int, dtype: str = "bf16", batch: int = 0,
                     gpu: str = "", page_size: int = 64, kv: str = "") -> Schedule:
    """The schedule of a shape: what `mlagen tune` measured best for this GPU, batch and
    s_q * h_q (tuned.tuned_knobs: main loop, tile knobs and split cost), else the wgmma
    main loop where MAINLOOP says so and the page size allows it, else the size class's
    TILE_KNOBS.  An 8-bit cache format kv: FP8_KNOBS (the tuned tables are bf16's)."""
    from .tuned import tuned_entry

    if kv and kv not in ("bf16", "fp16"):
        cls = 16 if rows_total <= 16 else 32 if rows_total <= 32 else 64
        rows, block_kv, buffers, warps = FP8_KNOBS[64 if page_size % 64 else cls]
        regs = FP8_REGS if (kv == "fp8_e4m3" and rows == 16
                            and batch >= FP8_REGS_BATCH) else {"warps": warps}
        return canonical(Schedule.build(name=f"hopper_default_{kv}_{dtype}", target="hopper",
                                        dtype=dtype, kv_format=kv, rows_per_tile=rows,
                                        block_kv=block_kv, buffers=buffers, mainloop="wgmma",
                                        **regs))
    # all three read, so that a malformed override is refused whichever one this shape uses
    tiles, wgmma, loops = tile_knobs(), wgmma_knobs(), mainloops()
    found = tuned_entry(gpu, batch, rows_total) if batch and gpu else None
    knobs = found[0] if found else None
    if knobs and not (knobs.get("mainloop") == "wgmma" and page_size % 64):
        from mlagen.errors import ScheduleError
        from mlagen.schedule.rules import check

        try:
            s = Schedule.build(name=f"hopper_tuned_{dtype}", target="hopper", dtype=dtype,
                               **knobs)
            check(s)
            return canonical(s)
        except (ScheduleError, TypeError, ValueError) as e:
            # the table is keyed by version, so this is a hand-edited or damaged entry:
            # refused with its file and key rather than silently replaced by the defaults
            why = e.message if isinstance(e, ScheduleError) else str(e)
            raise ScheduleError(f"tuned entry {found[2]!r} for {gpu}: {why}",
                                str(found[1])) from None

    cls = size_class(rows_total)
    if loops[cls] == "wgmma" and page_size % 64 == 0:
        rows, block_kv, buffers, warps = wgmma[cls]
        return canonical(Schedule.build(name=f"hopper_default_wgmma_{dtype}", target="hopper",
                                        dtype=dtype, rows_per_tile=rows, block_kv=block_kv,
                                        buffers=buffers, warps=warps, mainloop="wgmma"))
    rows, block_kv, buffers, warps = tiles[cls]
    return canonical(Schedule.build(name=f"hopper_default_r{rows}_{dtype}", target="hopper",
                                    dtype=dtype, rows_per_tile=rows, block_kv=block_kv,
                                    buffers=buffers, warps=warps))


def resolve(rows_total: int, dtype: str, schedule: Schedule | None, batch: int = 0,
            gpu: str = "", page_size: int = 64, kv: str = "") -> Schedule:
    """The canonical schedule of an eager call: the caller's (checked against the call:
    its kind, its main loop against the page size, the call's dtype), else the per-shape
    default for this GPU, batch, s_q * h_q and page size.  The cluster switch is read too,
    so that a malformed one is refused before a library is built or loaded (the library
    reads MLAGEN_HOPPER_CLUSTER when it loads).  kv: the cache's 8-bit format, or "" (a
    cache in the dtype); a schedule for another format is refused."""
    s = _resolved(rows_total, dtype, schedule, batch, gpu, page_size, kv)
    cluster_switch()
    return s


def _resolved(rows_total: int, dtype: str, schedule: Schedule | None, batch: int,
              gpu: str, page_size: int, kv: str = "") -> Schedule:
    from mlagen.errors import InputError

    if schedule is None:
        return default_schedule(rows_total, dtype, batch, gpu, page_size, kv)
    if schedule.target.kind != "hopper":
        raise InputError(f"schedule {schedule.name!r} is for target {schedule.target.kind!r}, "
                         "not hopper")
    if schedule.mapping.mainloop == "wgmma" and page_size % 64 and not gathers_keys(schedule):
        raise InputError(f"schedule {schedule.name!r} uses mainloop = \"wgmma\", which needs a "
                         f"page size that is a multiple of 64, not {page_size}")
    has = schedule.problem.kv
    sixteen = has in ("bf16", "fp16")
    if (sixteen and kv) or (not sixteen and has != kv):
        raise InputError(f"schedule {schedule.name!r} reads {has} caches, this k_cache is "
                         f"{kv or dtype}")
    if schedule.problem.dtype != dtype:
        # a 16-bit cache is in the call's dtype: the schedule's format follows it
        schedule = schedule.replace(dtype=dtype, **({"kv_format": ""} if sixteen else {}))
    return canonical(schedule)


def canonical(s: Schedule) -> Schedule:
    """The schedule a library is built from: the problem fields that are run-time arguments
    set to fixed values (every knob kept as it is), so that one build serves every head
    count, s_q and page size."""
    from mlagen.schedule.rules import plan_of

    c = s.replace(heads=128, tp=1, page_size=64, max_s_q=8)
    if c.problem.attention == "sparse":   # topk and the sinks are run-time too
        c = c.replace(topk=2048, sinks=False)
        if c.problem.extra_topk:   # so are the second pool's topk and page size
            c = c.replace(extra_topk=512, extra_page_size=0)
    c = dataclasses.replace(c, name=c.variant_name(), source=None)
    plan_of(c)           # checked (page_size 64 must still suit block_kv)
    return c
