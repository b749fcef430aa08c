"""The Hopper target's rules (run after the common ones in mlagen/schedule/rules.py)."""

from __future__ import annotations

from typing import Iterator

from ...errors import clip
from ...schedule.records import Schedule
from ...targets import Target
from .knobs import MAINLOOPS

Violation = tuple[str, str, str]

MAX_STAGES = 8   # mla_split.cuh's static_assert


def hopper_problem(s: Schedule, t: Target) -> Iterator[Violation]:
    p = s.problem
    if p.fused:
        yield "problem", "fused", ("fused = true is not available on target hopper "
                                   "(attention-only, FlashMLA's API)")
    if (p.kv_lora_rank, p.rope_dim) != (512, 64):
        yield "problem", "kv_lora_rank", ("the hopper kernels are built for kv_lora_rank = 512 "
                                          "and rope_dim = 64")


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
        if s.problem.page_size % 64:
            yield "problem", "page_size", (f"page_size = {s.problem.page_size}: mainloop = "
                                           "\"wgmma\" needs a multiple of 64 (a 64-key block "
                                           "is one TMA box of one page); use mainloop = "
                                           "\"mma_sync\"")
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


RULES = [hopper_problem, hopper_mapping]
