"""Timelines of a simulated SC11 trace: Gantt charts (matplotlib, Agg) and a text summary.

    plot_core(sim, core, path)   one core's engines (SDMA, GDMA, BDC, barrier), one row each
    plot_all(sim, path)          every core x engine, one row each
    text_summary(sim)            total, bounds, busy shares, the dominant engine, idle gaps

Bars are coloured by phase (weights/setup, A, B, merge, C) or by operation (DMA by its
memories, matmul, vector, barrier).  ``path`` without a suffix writes both .png and .svg.
Neighbouring bars of one colour closer than a pixel are merged so that a trace of 1e5 events
still draws quickly and gives a small SVG.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

from .costmodel import SimResult
from .trace import Engine, Mem, Op

PHASES = {0: "weights/setup", 1: "phase A", 2: "phase B", 3: "merge", 4: "phase C"}
PHASE_COLOURS = {0: "#9e9e9e", 1: "#1f77b4", 2: "#2ca02c", 3: "#d62728", 4: "#9467bd"}
ENGINE_NAMES = {Engine.SDMA: "SDMA", Engine.GDMA: "GDMA", Engine.BDC: "BDC",
                Engine.BARRIER: "barrier"}
OP_COLOURS = {
    "DMA DDR->L2": "#8c564b", "DMA L2->LMEM": "#17becf", "DMA DDR->LMEM": "#ff7f0e",
    "DMA LMEM->L2": "#bcbd22", "DMA LMEM->DDR": "#e377c2", "DMA other": "#7f7f7f",
    "matmul": "#1f77b4", "vector": "#2ca02c", "barrier": "#d62728",
}


def _op_label(op: int, src: int, dst: int) -> str:
    if op == Op.MATMUL:
        return "matmul"
    if op == Op.VECTOR:
        return "vector"
    if op == Op.BARRIER:
        return "barrier"
    name = f"DMA {Mem(src).name}->{Mem(dst).name}"
    return name if name in OP_COLOURS else "DMA other"


def _labels(sim: SimResult, by: str) -> list:
    ev = sim.events
    if by == "phase":
        return [PHASES.get(int(p), f"phase {int(p)}") for p in ev["phase"]]
    if by == "op":
        return [_op_label(int(o), int(s), int(d)) for o, s, d in
                zip(ev["op"], ev["src"], ev["dst"])]
    raise ValueError(f"colour by 'phase' or 'op', not {by!r}")


def _colour(label: str, by: str) -> str:
    if by == "phase":
        inv = {v: k for k, v in PHASES.items()}
        return PHASE_COLOURS.get(inv.get(label, -1), "#7f7f7f")
    return OP_COLOURS.get(label, "#7f7f7f")


def _merge(starts: np.ndarray, ends: np.ndarray, eps: float) -> list:
    """Intervals (sorted by start) merged where the gap is under eps: [(start, width)]."""
    out = []
    cs, ce = starts[0], ends[0]
    for s, e in zip(starts[1:], ends[1:]):
        if s - ce <= eps:
            ce = max(ce, e)
        else:
            out.append((cs, ce - cs))
            cs, ce = s, e
    out.append((cs, ce - cs))
    return out


def _outputs(path) -> list:
    p = Path(path)
    if p.suffix.lower() in (".png", ".svg"):
        return [p]
    return [p.with_suffix(".png"), p.with_suffix(".svg")]


def _gantt(sim: SimResult, rows: Sequence[tuple], path, title: str, by: str,
           width_px: int = 1600) -> list:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ev = sim.events
    labels = np.array(_labels(sim, by), dtype=object)
    scale = 1e6                                   # microseconds on the axis
    total = max(sim.total_s, 1e-12)
    eps = total / width_px
    height = max(2.0, 0.32 * len(rows) + 1.2)
    fig, ax = plt.subplots(figsize=(14, height))
    used = {}
    for r, (core, eng) in enumerate(rows):
        sel = (ev["core"] == core) & (ev["engine"] == eng)
        if not sel.any():
            continue
        for lab in np.unique(labels[sel]):
            s2 = sel & (labels == lab)
            st, en = sim.start[s2], sim.end[s2]
            o = np.argsort(st, kind="stable")
            bars = _merge(st[o], en[o], eps)
            col = _colour(lab, by)
            used[lab] = col
            ax.broken_barh([(a * scale, max(w * scale, eps * scale * 0.5)) for a, w in bars],
                           (r - 0.4, 0.8), facecolors=col, edgecolors="none")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"core {c} {ENGINE_NAMES[Engine(e)]}" for c, e in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, total * scale)
    ax.set_xlabel("time (us, simulated)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    order = list(PHASES.values()) if by == "phase" else list(OP_COLOURS)
    handles = [Patch(color=used[k], label=k) for k in order if k in used]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7,
                  frameon=False)
    fig.tight_layout()
    written = []
    for out in _outputs(path):
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
        written.append(out)
    plt.close(fig)
    return written


def plot_core(sim: SimResult, core: int, path, by: str = "op",
              title: Optional[str] = None) -> list:
    """One core's engines; returns the files written."""
    if core not in set(int(c) for c in sim.cores):
        raise ValueError(f"core {core} is not in the trace (cores {list(map(int, sim.cores))})")
    rows = [(core, e) for e in Engine]
    t = title or f"SC11 core {core}: {sim.total_s * 1e6:.1f} us simulated"
    return _gantt(sim, rows, path, t, by)


def plot_all(sim: SimResult, path, by: str = "phase", title: Optional[str] = None,
             engines: Iterable[Engine] = tuple(Engine)) -> list:
    """Every core x engine; returns the files written."""
    rows = [(int(c), e) for c in sim.cores for e in engines]
    t = title or (f"SC11, {len(sim.cores)} cores: {sim.total_s * 1e6:.1f} us simulated, "
                  f"{sim.bound_ratio:.2f}x the DDR/compute bound")
    return _gantt(sim, rows, path, t, by)


def text_summary(sim: SimResult, gaps: int = 5) -> str:
    """Total, bounds, per-engine busy shares, phases and the longest idle gaps."""
    us = 1e6
    lines = [
        f"simulated time     {sim.total_s * us:10.2f} us  ({len(sim.events)} events, "
        f"{len(sim.cores)} cores, {sim.barriers} barriers)",
        f"DDR bound          {sim.ddr_bound_s * us:10.2f} us  ({sim.ddr_bytes / 1e6:.2f} MB "
        f"at {sim.machine.ddr_bw_chip * sim.chips / 1e9:.0f} GB/s)",
        f"compute bound      {sim.compute_bound_s * us:10.2f} us  ({sim.flops / 1e9:.3f} GFLOP)",
        f"time / bound       {sim.bound_ratio:10.2f} x",
        f"pipelined bound    {sim.pipelined_bound_s() * us:10.2f} us",
        "busy share         mean   max   (over cores)",
    ]
    for e, (mean, mx) in sim.engine_share().items():
        lines.append(f"  {ENGINE_NAMES[e]:<16} {mean:5.1%} {mx:6.1%}")
    lines.append(f"dominant engine    {ENGINE_NAMES[sim.dominant_engine()]}")
    spans = sim.phase_spans()
    if spans:
        lines.append("phases             start .. end (us)")
        for ph, (a, b) in spans.items():
            lines.append(f"  {PHASES.get(ph, ph):<16} {a * us:8.2f} .. {b * us:8.2f}")
    g = sim.idle_gaps()
    if len(g) and gaps:
        w = g["end"] - g["start"]
        top = np.argsort(-w)[:gaps]
        lines.append(f"idle gaps          {len(g)} in all, {w.sum() * us:.2f} us; longest:")
        for i in top:
            lines.append(f"  core {g['core'][i]} {ENGINE_NAMES[Engine(g['engine'][i])]:<8} "
                         f"{g['start'][i] * us:8.2f} .. {g['end'][i] * us:8.2f} us")
    return "\n".join(lines)
