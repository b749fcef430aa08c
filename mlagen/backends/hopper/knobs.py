"""The Hopper target's knobs: the common ones (records.Mapping) plus these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ...schedule.records import Mapping, knob

MAINLOOPS = ("mma_sync", "wgmma")
# 8-bit KV caches: "dequant" converts K to the q dtype in the kernel (16-bit MMAs); "mma": e4m3
# MMAs on the raw bytes, Q quantized per row on the fly (the register path, mla_fp8_regs.cuh)
FP8_MMAS = ("dequant", "mma")


def gathers_keys(s) -> bool:
    """Whether a schedule's kernel gathers its keys one by one (cp.async by slot or block-table
    entry: any page size) rather than in TMA boxes of 64 keys of one page: sparse rows, and
    the 64-row kernel on 8-bit caches (mla_wgmma.cuh kGather)."""
    m = s.mapping
    return s.problem.attention == "sparse" or (
        m.mainloop == "wgmma" and m.rows_per_tile == 64 and s.problem.kv not in ("bf16", "fp16"))


@dataclass(frozen=True)
class HopperMapping(Mapping):
    # run-time: the metadata kernel cuts sequences; one build serves every split count
    split_kv: Union[int, str] = knob("auto", "partial-KV splits per sequence, or \"auto\"",
                                     compile_time=False)
    rows_per_tile: int = knob(32, "query rows (s_q * h_q packed) per CTA tile", tag="r")
    warps: int = knob(8, "warps per CTA (mma_sync); wgmma: consumer warps (4 or 8 = 1 or 2 "
                                 "consumer warpgroups)", tag="w")
    mainloop: str = knob("mma_sync", "main loop: mma_sync (cp.async) or wgmma", tag="")
    # compile-time for 8-bit caches only (backend.variant_parts leaves it out of 16-bit ones)
    fp8_mma: str = knob("dequant", "8-bit KV caches: \"dequant\" (K converted to bf16 in "
                                   "the kernel, 16-bit MMAs); \"mma\": e4m3 MMAs (dense "
                                   "fp8_e4m3, 16 rows, fp8_converters = 0)", tag="fp8")
    fp8_converters: int = knob(1, "8-bit KV caches: converter warpgroups (1 or 2), or 0: "
                                  "the consumer converts its operands in registers",
                               tag="fp8cv")
    fp8_raw_slots: int = knob(2, "8-bit KV caches: raw 64-key blocks in shared memory (2 or "
                                 "3; 2..5 with fp8_converters = 0)", tag="fp8raw")
    # run-time: the metadata kernel's cost of one split (the split policy "auto")
    split_cost: int = knob(5, "split policy \"auto\": 64-token blocks' worth of cost per split",
                           compile_time=False)

    def variant_parts(self, s):
        # heads, s_q and the page size are run-time arguments: only dtype, the KV format
        # and the tile knobs are compiled in, so every shape with the same knobs shares one
        # build; a 16-bit cache's names carry neither its format (the dtype) nor fp8_mma
        parts = super().variant_parts(s)
        if s.problem.d != 576:   # the key's width (mla_common.cuh kD): 576 unsaid
            parts.insert(1, f"dqk{s.problem.d}")
        if s.problem.attention == "sparse":   # topk, sinks: run-time; the kernel's mode
            # a second pool (extra_topk; its topk and page size run-time) is another kernel
            pools = ["pools2"] if s.problem.extra_topk else []
            parts = parts[:1] + ["sparse", *pools] + parts[1:]
        kv = s.problem.kv
        if kv in ("bf16", "fp16"):
            parts = [x for x in parts if not x.startswith("fp8")]
            return parts[:1] + [s.problem.dtype] + parts[1:]
        return parts[:1] + [s.problem.dtype, kv.replace("_", "")] + parts[1:]
