"""The Hopper target's knobs: the common ones (records.Mapping) plus these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ...schedule.records import Mapping, knob

MAINLOOPS = ("mma_sync", "wgmma")


@dataclass(frozen=True)
class HopperMapping(Mapping):
    # run-time: the metadata kernel cuts sequences; one build serves every split count
    split_kv: Union[int, str] = knob("auto", "partial-KV splits per sequence, or \"auto\"",
                                     compile_time=False)
    rows_per_tile: int = knob(32, "query rows (s_q * h_q packed) per CTA tile", tag="r")
    warps: int = knob(8, "warps per CTA (mma_sync); wgmma: consumer warps (4 or 8 = 1 or 2 "
                                 "consumer warpgroups)", tag="w")
    mainloop: str = knob("mma_sync", "main loop: mma_sync (cp.async) or wgmma", tag="")
    # run-time: the metadata kernel's cost of one split (the split policy "auto")
    split_cost: int = knob(5, "split policy \"auto\": 64-token blocks' worth of cost per split",
                           compile_time=False)

    def variant_parts(self, s):
        # heads, s_q and the page size are run-time arguments: only dtype and the tile
        # knobs are compiled in, so every shape with the same knobs shares one build
        parts = super().variant_parts(s)
        return parts[:1] + [s.problem.dtype] + parts[1:]
