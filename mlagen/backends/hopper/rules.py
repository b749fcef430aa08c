"""The Hopper target's rules (run after the common ones in mlagen/schedule/rules.py)."""

from __future__ import annotations

from typing import Iterator

from ...errors import clip
from ...schedule.records import Schedule
from ...targets import Target
from .knobs import FP8_MMAS, MAINLOOPS, gathers_keys

Violation = tuple[str, str, str]

MAX_STAGES = 8   # mla_split.cuh's static_assert


def hopper_problem(s: Schedule, t: Target) -> Iterator[Violation]:
    p = s.problem
    if p.fused:
        yield "problem", "fused", ("fused = true is not available on target hopper "
                                   "(attention-only, FlashMLA's API)")
    # the key's width d_qk (mla_common.cuh kD): 576, or 512 (a 448-value latent) in the
    # wgmma kernels' sparse modes; the values are the key's first 512 columns either way
    if (p.kv_lora_rank, p.rope_dim) not in ((512, 64), (448, 64)):
        yield "problem", "kv_lora_rank", ("the hopper kernels are built for kv_lora_rank = 512 "
                                          "or 448 with rope_dim = 64 (d_qk 576 or 512)")
        return
    if p.dv != 512:
        yield "problem", "v_dim", (f"v_dim = {p.dv}: the hopper kernels' values are the key's "
                                   "first 512 columns (v_dim = 512)")
    if p.d == 512:
        m = s.mapping
        if p.attention != "sparse" or m.mainloop != "wgmma":
            yield "problem", "kv_lora_rank", ("kv_lora_rank = 448 (d_qk 512) is read by the "
                                              "wgmma kernels' sparse modes alone: "
                                              "attention = \"sparse\", mainloop = \"wgmma\"")
        if p.kv not in ("bf16", "fp8_ue8m0_paged"):
            yield "problem", "kv_format", (f"kv_format = {p.kv!r}: d_qk 512 reads bf16 or "
                                           "fp8_ue8m0_paged caches on hopper")
    elif p.kv == "fp8_ue8m0_paged":
        yield "problem", "kv_format", ("kv_format = \"fp8_ue8m0_paged\" is d_qk 512's format "
                                       "on hopper (kv_lora_rank = 448, rope_dim = 64)")


def hopper_mapping(s: Schedule, t: Target) -> Iterator[Violation]:
    m = s.mapping
    if isinstance(m.split_kv, str):
        if m.split_kv != "auto":
            yield "schedule", "split_kv", f"split_kv = {clip(repr(m.split_kv))} must be \"auto\" or an integer"
    elif not 1 <= m.split_kv <= 64:
        yield "schedule", "split_kv", f"split_kv = {m.split_kv} must be between 1 and 64"
    if m.mainloop not in MAINLOOPS:
        yield "schedule", "mainloop", (f"mainloop = {clip(repr(m.mainloop))} must be one of "
                                       f"{', '.join(MAINLOOPS)}")
    elif m.mainloop == "wgmma":
        # mla_wgmma.cuh: 64-row tiles, 64-key blocks (one TMA box of one page), 2 K stages,
        # two consumer warpgroups (8 warps) beside the producer; mla_wgmma_rows.cuh (16 or
        # 32 rows per tile, the rows in wgmma's N): the same blocks, one consumer warpgroup
        # (warps = 4) or two taking alternate blocks (warps = 8)
        warps = (8,) if m.rows_per_tile == 64 else (4, 8)
        for key, want in (("block_kv", (64,)), ("buffers", (2,)), ("warps", warps)):
            if getattr(m, key) not in want:
                yield "schedule", key, (f"{key} = {getattr(m, key)}: mainloop = \"wgmma\" "
                                        f"with rows_per_tile = {m.rows_per_tile} needs "
                                        f"{key} = {' or '.join(map(str, want))}")
        if s.problem.page_size % 64 and not gathers_keys(s):
            # (sparse rows and the 64-row kernel's 8-bit caches gather key by key: any page
            # size) 8-bit caches have no mma_sync kernel to fall back on
            fix = ("" if s.problem.kv in ("fp8_e4m3", "fp8_ds_mla") else
                   "; use mainloop = \"mma_sync\"")
            yield "problem", "page_size", (f"page_size = {s.problem.page_size}: mainloop = "
                                           "\"wgmma\" needs a multiple of 64 (a 64-key block "
                                           f"is one TMA box of one page){fix}")
    if m.rows_per_tile not in (16, 32, 64):
        yield "schedule", "rows_per_tile", f"rows_per_tile = {m.rows_per_tile} must be 16, 32 or 64"
    if m.warps not in (4, 8):
        yield "schedule", "warps", f"warps = {m.warps} must be 4 or 8"
    if m.block_kv not in (16, 32, 64):
        yield "schedule", "block_kv", f"block_kv = {m.block_kv} must be 16, 32 or 64 on hopper"
    # at least 1: at 0 an empty request costs nothing and, at the end of a batch, can fall
    # past the last part, so no CTA writes its output
    if not 1 <= m.split_cost <= 64:
        yield "schedule", "split_cost", (f"split_cost = {m.split_cost} must be 1..64 (64-token "
                                         "blocks' worth of cost per split)")
    if not 1 <= m.buffers <= MAX_STAGES:
        yield "schedule", "buffers", (f"buffers = {m.buffers} must be 1..{MAX_STAGES} "
                                      "(cp.async pipeline stages) on hopper")


def hopper_kv_format(s: Schedule, t: Target) -> Iterator[Violation]:
    """8-bit caches: the few-rows wgmma kernel with its converter warpgroup
    (mla_wgmma_rows.cuh, mla_fp8.cuh), one consumer warpgroup, 64-key TMA blocks; or the
    64-row kernel, whose producer warpgroup gathers and converts (mla_wgmma.cuh)."""
    p, m = s.problem, s.mapping
    if m.fp8_mma not in FP8_MMAS:
        yield "schedule", "fp8_mma", (f"fp8_mma = {m.fp8_mma!r} must be one of "
                                      f"{', '.join(FP8_MMAS)}")
        return
    if m.fp8_converters not in (0, 1, 2):
        yield "schedule", "fp8_converters", (f"fp8_converters = {m.fp8_converters} must be 0 "
                                             "(the consumer converts in registers), 1 or 2 "
                                             "(converter warpgroups)")
    raw_slots = (2, 3, 4, 5) if m.fp8_converters == 0 else (2, 3)
    if m.fp8_raw_slots not in raw_slots:
        yield "schedule", "fp8_raw_slots", (f"fp8_raw_slots = {m.fp8_raw_slots} must be "
                                            f"{raw_slots[0]}..{raw_slots[-1]} with "
                                            f"fp8_converters = {m.fp8_converters}")
    if p.kv not in ("fp8_e4m3", "fp8_ds_mla", "fp8_ue8m0_paged"):
        if m.fp8_raw_slots != 2:
            yield "schedule", "fp8_raw_slots", (f"fp8_raw_slots = {m.fp8_raw_slots}: raw "
                                                "slots are for 8-bit kv_formats; this cache "
                                                f"is {p.kv}")
        if m.fp8_converters != 1:
            yield "schedule", "fp8_converters", (f"fp8_converters = {m.fp8_converters}: "
                                                 "converters are for 8-bit kv_formats; "
                                                 f"this cache is {p.kv}")
        return
    if m.fp8_mma == "mma" and (p.kv != "fp8_e4m3" or p.attention == "sparse"
                               or m.rows_per_tile != 16 or m.fp8_converters != 0):
        # mla_fp8_regs.cuh: the e4m3 MMAs are built on the register path alone
        yield "schedule", "fp8_mma", ("fp8_mma = \"mma\" (e4m3 MMAs) is built for dense "
                                      "fp8_e4m3 caches with rows_per_tile = 16 and "
                                      "fp8_converters = 0 (this schedule: "
                                      f"{p.kv}, {p.attention}, {m.rows_per_tile} rows, "
                                      f"{m.fp8_converters} converters); use \"dequant\"")
    if m.mainloop != "wgmma" or m.rows_per_tile not in (16, 32, 64):
        key = "mainloop" if m.mainloop != "wgmma" else "rows_per_tile"
        yield "schedule", key, (f"kv_format = {p.kv!r} is read by the wgmma kernels: "
                                "mainloop = \"wgmma\" with rows_per_tile = 16, 32 or 64 "
                                f"(this schedule: {m.mainloop}, {m.rows_per_tile} rows)")
    elif m.rows_per_tile == 64 and (m.fp8_converters, m.fp8_raw_slots) != (1, 2):
        # mla_wgmma.cuh: the producer warpgroup converts in the stages (no raw ring)
        key = "fp8_converters" if m.fp8_converters != 1 else "fp8_raw_slots"
        yield "schedule", key, (f"{key} = {getattr(m, key)}: rows_per_tile = 64 converts "
                                "in its producer warpgroup, into its K stages (fp8_converters "
                                "= 1, fp8_raw_slots = 2)")
    elif m.rows_per_tile < 64 and m.warps != 4 and not (m.fp8_converters == 0
                                                        and m.warps == 8):
        yield "schedule", "warps", (f"warps = {m.warps}: kv_format = {p.kv!r} takes one "
                                    "consumer warpgroup (warps = 4; the converter warpgroup "
                                    "has the other's registers), or two (warps = 8) with "
                                    "fp8_converters = 0")
    if m.fp8_converters == 0 and (p.kv != "fp8_e4m3" or p.attention == "sparse"
                                  or m.rows_per_tile != 16):
        # mla_fp8_regs.cuh: the 16-row consumer's registers hold O^T, S^T and the fragments
        yield "schedule", "fp8_converters", ("fp8_converters = 0 (conversion in the "
                                             "consumer's registers) reads dense fp8_e4m3 "
                                             "caches with rows_per_tile = 16 (this schedule: "
                                             f"{p.kv}, {p.attention}, {m.rows_per_tile} rows)")
    if p.kv in ("fp8_ds_mla", "fp8_ue8m0_paged") and p.dtype != "bf16":
        yield "problem", "dtype", (f"dtype = {p.dtype!r}: kv_format = {p.kv!r} stores "
                                   "its RoPE values in bf16, so q must be bf16")


SPARSE_FORMATS = ("bf16", "fp8_ds_mla", "fp8_ue8m0_paged")


def hopper_sparse(s: Schedule, t: Target) -> Iterator[Violation]:
    """attention = "sparse": the wgmma kernels' sparse modes (mla_wgmma_rows.cuh for 16 / 32
    rows, mla_wgmma.cuh for 64, SP: a producer warpgroup gathers the named keys with
    cp.async); a second pool (extra_topk, SP = 2) in the same softmax, in the main pool's
    format, at any page size (mla_sparse.cuh SparseRow)."""
    p, m = s.problem, s.mapping
    if p.attention != "sparse":
        return
    if p.kv not in SPARSE_FORMATS:
        yield "problem", "kv_format", (f"kv_format = {p.kv!r}: attention = \"sparse\" reads "
                                       f"{', '.join(SPARSE_FORMATS[:-1])} or "
                                       f"{SPARSE_FORMATS[-1]} caches on hopper")
    if p.extra_topk and p.extra_kv != p.kv:
        # one kernel reads both pools: the gather's element size and the converter are the
        # main pool's
        yield "problem", "extra_kv_format", (f"extra_kv_format = {p.extra_kv!r}: the hopper "
                                             "sparse kernel reads both pools in one format "
                                             f"(kv_format = {p.kv!r})")
    # rows 16 / 32: the few-rows kernel (one consumer warpgroup); 64: the 64-row kernel's
    # sparse mode (mla_wgmma.cuh SP; fp8_ds_mla converted by its producer warpgroup)
    if m.mainloop != "wgmma" or m.rows_per_tile not in (16, 32, 64):
        key = "mainloop" if m.mainloop != "wgmma" else "rows_per_tile"
        yield "schedule", key, ("attention = \"sparse\" is read by the wgmma kernels' sparse "
                                "modes: mainloop = \"wgmma\" with rows_per_tile = 16, 32 or 64 "
                                f"(this schedule: {m.mainloop}, {m.rows_per_tile} rows)")
    elif m.rows_per_tile < 64 and m.warps != 4:
        yield "schedule", "warps", (f"warps = {m.warps}: attention = \"sparse\" with "
                                    f"rows_per_tile = {m.rows_per_tile} takes one consumer "
                                    "warpgroup (warps = 4)")
    if m.fp8_converters != 1:
        yield "schedule", "fp8_converters", (f"fp8_converters = {m.fp8_converters}: attention "
                                             "= \"sparse\" takes one converter warpgroup")


RULES = [hopper_problem, hopper_mapping, hopper_kv_format, hopper_sparse]
