"""Timelines of a simulated SC11 trace: Gantt charts (matplotlib, Agg) and a text summary.

    plot_core(sim, core, path)   one core's engines (SDMA, GDMA, BDC, barrier), one row each
    plot_all(sim, path)          every core x engine, one row each
    text_summary(sim)            total, bounds, busy and idle time per engine, phases

Bars are coloured by engine (the same colour for an engine on every chart; the default), by
phase (A, B, merge, C; weight loads apart) or by operation (DMA by its memories, matmul,
vector, barrier).  The phases A, B, merge, C run one after the other, so the charts shade
them behind the bars; weight loads ("weights/setup") stream beside them and are counted
apart, not as a span.  ``path`` without a suffix writes both .png and .svg.  Neighbouring
bars of one colour closer than a pixel are merged so that a trace of 1e5 events still draws
quickly and gives a small SVG.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

from .costmodel import SimResult
from .trace import Engine, Mem, Op

PHASES = {0: "weights/setup", 1: "phase A", 2: "phase B", 3: "merge", 4: "phase C"}
SETUP = 0                       # weight loads: beside the phases, not one of them
PHASE_COLOURS = {0: "#9e9e9e", 1: "#1f77b4", 2: "#2ca02c", 3: "#d62728", 4: "#9467bd"}
ENGINE_NAMES = {Engine.SDMA: "SDMA", Engine.GDMA: "GDMA", Engine.BDC: "BDC",
                Engine.BARRIER: "barrier"}
ENGINE_COLOURS = {"SDMA": "#8c564b", "GDMA": "#ff7f0e", "BDC": "#1f77b4",
                  "barrier": "#d62728"}
BAND_COLOURS = ("#f2f2f2", "#e0e8f0")      # alternating phase shading behind the bars
OP_COLOURS = {
    "DMA DDR->L2": "#8c564b", "DMA L2->LMEM": "#17becf", "DMA DDR->LMEM": "#ff7f0e",
    "DMA LMEM->L2": "#bcbd22", "DMA LMEM->DDR": "#e377c2", "DMA other": "#7f7f7f",
    "matmul": "#1f77b4", "vector": "#2ca02c", "dequant": "#9467bd", "barrier": "#d62728",
}


def _op_label(op: int, src: int, dst: int) -> str:
    if op == Op.MATMUL:
        return "matmul"
    if op == Op.VECTOR:
        return "vector"
    if op == Op.BARRIER:
        return "barrier"
    if op == Op.DEQUANT:
        return "dequant"
    name = f"DMA {Mem(src).name}->{Mem(dst).name}"
    return name if name in OP_COLOURS else "DMA other"


def _labels(sim: SimResult, by: str) -> list:
    ev = sim.events
    if by == "engine":
        return [ENGINE_NAMES[Engine(int(e))] for e in ev["engine"]]
    if by == "phase":
        return [PHASES.get(int(p), f"phase {int(p)}") for p in ev["phase"]]
    if by == "op":
        return [_op_label(int(o), int(s), int(d)) for o, s, d in
                zip(ev["op"], ev["src"], ev["dst"])]
    raise ValueError(f"colour by 'engine', 'phase' or 'op', not {by!r}")


def _colour(label: str, by: str) -> str:
    if by == "engine":
        return ENGINE_COLOURS[label]
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
    # the sequential phases as shaded bands with their names on top
    for i, (ph, (a, b)) in enumerate(phase_bands(sim).items()):
        ax.axvspan(a * scale, b * scale, color=BAND_COLOURS[i % 2], zorder=0, lw=0)
        ax.text((a + b) / 2 * scale, -0.55, PHASES.get(ph, f"phase {ph}"), ha="center",
                va="bottom", fontsize=7, color="#555555", clip_on=False)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"core {c} {ENGINE_NAMES[Engine(e)]}" for c, e in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, total * scale)
    ax.set_xlabel("time (us, simulated)")
    ax.set_title(title, fontsize=10, pad=14)
    ax.grid(axis="x", alpha=0.3)
    order = {"engine": list(ENGINE_COLOURS), "phase": list(PHASES.values()),
             "op": list(OP_COLOURS)}[by]
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


def plot_core(sim: SimResult, core: int, path, by: str = "engine",
              title: Optional[str] = None) -> list:
    """One core's engines; returns the files written."""
    if core not in set(int(c) for c in sim.cores):
        raise ValueError(f"core {core} is not in the trace (cores {list(map(int, sim.cores))})")
    rows = [(core, e) for e in Engine]
    t = title or f"SC11 core {core}: {sim.total_s * 1e6:.1f} us simulated"
    return _gantt(sim, rows, path, t, by)


def plot_all(sim: SimResult, path, by: str = "engine", title: Optional[str] = None,
             engines: Iterable[Engine] = tuple(Engine)) -> list:
    """Every core x engine; returns the files written."""
    rows = [(int(c), e) for c in sim.cores for e in engines]
    t = title or (f"SC11, {len(sim.cores)} cores: {sim.total_s * 1e6:.1f} us simulated, "
                  f"{sim.bound_ratio:.2f}x the DDR/compute bound")
    return _gantt(sim, rows, path, t, by)


def phase_bands(sim: SimResult) -> dict:
    """phase -> (start, end) of the sequential phases (A, B, merge, C), weight loads left
    out: they stream beside every phase, so their span would cover the whole run."""
    return {ph: ab for ph, ab in sorted(sim.phase_spans().items()) if ph != SETUP}


def idle_per_engine(sim: SimResult) -> dict:
    """Engine -> (mean, max) over the cores of its idle time in seconds: the run time less
    the time it was busy.  Each is at most the run time (one core's queue, not a sum)."""
    out = {}
    for e, (mean, mx) in sim.engine_share().items():
        idle = [sim.total_s * (1.0 - sim.busy_share(int(c), e)) for c in sim.cores]
        out[e] = (float(np.mean(idle)), float(np.max(idle)))
    return out


def text_summary(sim: SimResult, gaps: int = 3) -> str:
    """Total, bounds, busy and idle time per engine, phases and the longest idle gaps (one
    line per engine and interval, with the cores that share it)."""
    us = 1e6
    lines = [
        f"simulated time     {sim.total_s * us:10.2f} us  ({len(sim.events)} events, "
        f"{len(sim.cores)} cores, {sim.barriers} barriers)",
        f"DDR bound          {sim.ddr_bound_s * us:10.2f} us  ({sim.ddr_bytes / 1e6:.2f} MB "
        f"at {sim.machine.ddr_bw_chip * sim.chips / 1e9:.0f} GB/s)",
        f"compute bound      {sim.compute_bound_s * us:10.2f} us  ({sim.flops / 1e9:.3f} GFLOP)",
        f"time / bound       {sim.bound_ratio:10.2f} x",
        f"pipelined bound    {sim.pipelined_bound_s() * us:10.2f} us",
        "per engine         busy mean  max    idle mean      max  (us per core)",
    ]
    idle = idle_per_engine(sim)
    for e, (mean, mx) in sim.engine_share().items():
        lines.append(f"  {ENGINE_NAMES[e]:<16} {mean:6.1%} {mx:6.1%}  {idle[e][0] * us:10.2f} "
                     f"{idle[e][1] * us:8.2f}")
    lines.append(f"dominant engine    {ENGINE_NAMES[sim.dominant_engine()]}")
    ev = sim.events
    gather = (ev["engine"] == Engine.SDMA) & (ev["op"] == Op.DMA)
    if gather.any():
        lines.append(f"SDMA gathers       {int(ev['bytes'][gather].sum()) / 1e6:10.2f} MB DDR -> L2 "
                     f"(the KV cache in its format's bytes)")
        desc = gather & (ev["m"] > 0)
        if desc.any():   # token-sparse gathers: a descriptor a run (paged: two, data and scales)
            n = int(ev["m"][desc].sum())
            busy = n * sim.machine.descriptor_cycles / sim.machine.dma_hz / len(sim.cores)
            lines.append(f"gather descriptors {n:10d}, {busy * us:.2f} us of SDMA "
                         f"descriptor time per core")
    deq = ev["op"] == Op.DEQUANT
    if deq.any():
        busy = float((sim.end[deq] - sim.start[deq]).sum()) / len(sim.cores)
        lines.append(f"BDC dequantization {busy * us:10.2f} us per core ({int(deq.sum())} blocks, "
                     f"{int(ev['n'][deq].sum()) / 1e6:.2f} M values to 16 bits)")
    bands = phase_bands(sim)
    if bands:
        lines.append("phases             start .. end (us)")
        for ph, (a, b) in bands.items():
            lines.append(f"  {PHASES.get(ph, ph):<16} {a * us:8.2f} .. {b * us:8.2f}")
    setup = sim.events["phase"] == SETUP
    if setup.any():
        busy = float((sim.end[setup] - sim.start[setup]).sum()) / len(sim.cores)
        lines.append(f"  {PHASES[SETUP]:<16} {int(setup.sum())} loads beside the phases, "
                     f"{busy * us:.2f} us of DMA per core")
    g = sim.idle_gaps()
    if len(g) and gaps:
        # the same gap on many cores is one line: (engine, start, end) -> cores
        shared: dict = {}
        for c, e, a, b in zip(g["core"], g["engine"], g["start"], g["end"]):
            shared.setdefault((int(e), round(a * us, 2), round(b * us, 2)), []).append(int(c))
        top = sorted(shared.items(), key=lambda kv: kv[0][1] - kv[0][2])[:gaps]
        lines.append("longest idle gaps")
        for (e, a, b), cores in top:
            lines.append(f"  {ENGINE_NAMES[Engine(e)]:<8} {a:8.2f} .. {b:8.2f} us  "
                         f"({b - a:.2f} us) on {_cores(cores)}")
    return "\n".join(lines)


def _cores(cores: list) -> str:
    cores = sorted(set(cores))
    if len(cores) == 1:
        return f"core {cores[0]}"
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"cores {cores[0]}-{cores[-1]}"
    return "cores " + ",".join(map(str, cores))
