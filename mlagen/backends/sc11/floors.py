"""Hardware floors of a simulated SC11 run: per barrier-delimited segment, its DDR bytes at
the chip's whole DDR bandwidth and its matmul FLOPs at the cube peak of every core (fp32-
operand products at the fp32 rate).  Nothing in the simulation can beat them.

    phase_floors(sim) -> [Segment]     floor_s(sim)     floors_table(sim) (markdown)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .costmodel import SimResult
from .trace import Engine, Mem, Op

US = 1e6
PHASE_NAMES = {0: "weights", 1: "A", 2: "B", 3: "merge", 4: "C"}


# ---------------------------------------------------------------------------------------
# Hardware floors
# ---------------------------------------------------------------------------------------
@dataclass
class Segment:
    phases: str                 # the phases whose events fall in it, e.g. "A" or "B"
    time_s: float               # simulated: from the previous barrier's end to this one's
    ddr_bytes: int
    flops: int                  # matmul FLOPs (fp32-operand ones counted at their own peak)
    ddr_floor_s: float
    compute_floor_s: float
    busiest: str                # the engine busiest on its busiest core in the segment

    @property
    def floor_s(self) -> float:
        return max(self.ddr_floor_s, self.compute_floor_s)

    @property
    def ratio(self) -> float:
        return self.time_s / self.floor_s if self.floor_s > 0 else float("inf")


def phase_floors(sim: SimResult) -> list[Segment]:
    """The trace cut at its barriers (every core passes them together); per segment the
    DDR floor (its DDR bytes at the chip's whole DDR bandwidth) and the compute floor (its
    matmul FLOPs at the cube peak of every core, fp32-operand products at the fp32 rate)."""
    ev, mc = sim.events, sim.machine
    core = ev["core"].astype(np.int64)
    is_bar = ev["engine"] == Engine.BARRIER
    seg = np.zeros(len(ev), np.int64)
    for c in np.unique(core):
        on = core == c
        # the segment of an event = barriers its core passed before it (by id)
        seg[on] = np.cumsum(is_bar[on]) - is_bar[on]
    bar_end = sorted({float(sim.end[i]) for i in np.nonzero(is_bar)[0]})
    ncores = max(1, len(sim.cores))
    chips = sim.chips
    out = []
    t_prev = 0.0
    for k in range(int(seg.max()) + 1 if len(ev) else 0):
        sel = (seg == k) & ~is_bar
        if not sel.any():
            continue
        e = ev[sel]
        t_end = bar_end[k] if k < len(bar_end) else sim.total_s
        ddr = (e["op"] == Op.DMA) & ((e["src"] == Mem.DDR) | (e["dst"] == Mem.DDR))
        ddr_bytes = int(e["bytes"][ddr].sum())
        mm = e["op"] == Op.MATMUL
        fl = 2 * e["m"][mm] * e["n"][mm] * e["k"][mm]
        fp32 = e["elems"][mm] == 4
        eff = float(fl[~fp32].sum()) + float(fl[fp32].sum()) * mc.cube_fp32_slowdown
        phases = sorted({int(p) for p in e["phase"]} - {0}) or [0]
        busy = {}
        for eng in (Engine.SDMA, Engine.GDMA, Engine.BDC):
            m = e["engine"] == eng
            if m.any():
                idx = np.nonzero(sel)[0][m]
                d = sim.end[idx] - sim.start[idx]
                per_core = np.bincount(core[idx], weights=d)
                busy[eng.name] = float(per_core.max())
        out.append(Segment("+".join(PHASE_NAMES[p] for p in phases), t_end - t_prev, ddr_bytes,
                           int(fl.sum()), ddr_bytes / (mc.ddr_bw_chip * chips),
                           eff / (mc.peak_flops_core * ncores),
                           max(busy, key=busy.get) if busy else "-"))
        t_prev = t_end
    return out


def floor_s(sim: SimResult) -> float:
    """The whole run's floor: the segments' floors added (barriers separate them)."""
    return sum(s.floor_s for s in phase_floors(sim))


def floors_table(sim: SimResult) -> str:
    rows = ["| segment | simulated (us) | DDR MB | DDR floor (us) | MFLOP | compute floor (us) "
            "| floor (us) | simulated / floor | busiest engine |",
            "|---|---|---|---|---|---|---|---|---|"]
    segs = phase_floors(sim)
    for s in segs:
        rows.append(f"| {s.phases} | {s.time_s * US:.1f} | {s.ddr_bytes / 1e6:.1f} | "
                    f"{s.ddr_floor_s * US:.1f} | {s.flops / 1e6:.0f} | "
                    f"{s.compute_floor_s * US:.1f} | {s.floor_s * US:.1f} | {s.ratio:.2f} | "
                    f"{s.busiest} |")
    tot = sum(s.floor_s for s in segs)
    rows.append(f"| **total** | {sim.total_s * US:.1f} | "
                f"{sum(s.ddr_bytes for s in segs) / 1e6:.1f} | | | | {tot * US:.1f} | "
                f"**{sim.total_s / tot:.2f}** | |")
    return "\n".join(rows)
