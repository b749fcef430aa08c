"""Honest SC11 figures: each simulated time beside its hardware floor, the double-buffer
saving as a range over the plausible readings of every assumed machine parameter, the
two-chip card, and `auto` judged by its regret under readings it did not choose with.

    phase_floors(sim)          per barrier-delimited segment: simulated time, DDR bytes /
                               chip DDR bandwidth, FLOPs / cube peak, the floor and ratio
    READINGS                   (parameter, label, Machine override) per plausible reading
    saving_range(schedule)     the seed point under every reading: 1, 2, 3 buffers
    auto_regret(schedule)      auto's pick (default reading) against the best scheme under
                               each reading, over a grid
    card_report()              a card as two chips (16 heads a chip, tp = 4 over cards)

Every time is simulated (costmodel.py) on targets/sc11.toml; nothing here was measured on a
card.  `python benchmarks/sc11_ranges.py` prints them (and writes the chart with --chart).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from ...schedule.records import Schedule
from .bench import SEED, _schedule, _with_buffers, dry_inputs, emulator_dry_run
from .costmodel import Machine, simulate
from .floors import US, floor_s, floors_table, phase_floors  # noqa: F401 (re-exported)
from .schemes import SCHEMES, machine_for
from .trace import Mem


# ---------------------------------------------------------------------------------------
# Readings of the assumed parameters
# ---------------------------------------------------------------------------------------
def _lat(mc: Machine, l2: float) -> Machine:
    lat = list(mc.latency)
    lat[Mem.L2] = l2
    return mc.replace(latency=tuple(lat))


# (parameter, reading, how the machine changes); the first reading of each is the default
READINGS: list[tuple[str, str, Callable[[Machine], Machine]]] = [
    ("default", "as targets/sc11.toml", lambda m: m),
    ("l2_bw_scope", "128 GB/s per chip, shared (port contention)",
     lambda m: m.replace(l2_scope="chip")),
    ("l2_bw_scope", "128 GB/s per chip for the GDMAs (SDMA writes L2 by its own port)",
     lambda m: m.replace(l2_scope="chip_gdma")),
    ("l2_bw", "64 GB/s per core", lambda m: m.replace(l2_bw=64e9)),
    ("l2_bw", "256 GB/s per core", lambda m: m.replace(l2_bw=256e9)),
    ("sdma_engines", "1 per chip (128 GB/s for all gathers)",
     lambda m: m.replace(sdma_engines=1)),
    ("sdma_engines", "2 per chip", lambda m: m.replace(sdma_engines=2)),
    ("sdma_bw", "64 GB/s per engine", lambda m: m.replace(sdma_bw=64e9)),
    ("cube_fp32_slowdown", "1: fp32 P and q_nope at the bf16 rate (16-bit cube operands)",
     lambda m: m.replace(cube_fp32_slowdown=1)),
    ("cube_fp32_slowdown", "8", lambda m: m.replace(cube_fp32_slowdown=8)),
    ("issue_cycles", "20", lambda m: m.replace(issue=20)),
    ("issue_cycles", "50", lambda m: m.replace(issue=50)),
    ("barrier_s", "1 us", lambda m: m.replace(barrier_s=1e-6)),
    ("barrier_s", "2 us", lambda m: m.replace(barrier_s=2e-6)),
    ("l2_latency_s", "30 ns", lambda m: _lat(m, 30e-9)),
    ("l2_latency_s", "120 ns", lambda m: _lat(m, 120e-9)),
    ("pessimistic", "L2 per chip + 1 SDMA engine + issue_cycles 50",
     lambda m: m.replace(l2_scope="chip", sdma_engines=1, issue=50)),
]


@dataclass
class RangeRow:
    param: str
    reading: str
    times: dict                  # buffers -> seconds (the scheme fixed: the default's best)
    floor_s: float

    def saving(self, a: int = 1, b: int = 2) -> float:
        return 1.0 - self.times[b] / self.times[a]


@dataclass
class SavingRange:
    schedule: str
    scheme: str
    batch: int
    seqlen: int
    rows: list = field(default_factory=list)

    def ends(self) -> tuple[RangeRow, RangeRow]:
        by = sorted(self.rows, key=lambda r: r.saving())
        return by[0], by[-1]

    def markdown(self) -> str:
        lo, hi = self.ends()
        out = [f"Scheme {self.scheme}, batch {self.batch}, seqlen {self.seqlen} "
               f"({self.schedule}); each row changes one assumed parameter (the last row "
               f"several) on the same traces.", "",
               "| parameter | reading | 1 buffer (us) | 2 buffers (us) | 3 buffers (us) | "
               "saving 1 -> 2 | 2 buffers / floor |", "|---|---|---|---|---|---|---|"]
        for r in self.rows:
            t3 = f"{r.times[3] * US:.1f}" if 3 in r.times else "-"
            out.append(f"| {r.param} | {r.reading} | {r.times[1] * US:.1f} | "
                       f"{r.times[2] * US:.1f} | {t3} | {r.saving():.1%} | "
                       f"{r.times[2] / r.floor_s:.2f} |")
        out += ["", f"**The saving ranges from {lo.saving():.1%} ({lo.param}: {lo.reading}) "
                f"to {hi.saving():.1%} ({hi.param}: {hi.reading}).**"]
        return "\n".join(out)

    def chart(self, path: Path) -> list[Path]:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.rows
        fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.2))
        y = np.arange(len(rows))
        ax.barh(y, [r.saving() * 100 for r in rows],
                color=["#444" if r.param == "default" else "#4a7ebb" for r in rows])
        ax.set_yticks(y, [f"{r.param}: {r.reading}"[:60] for r in rows], fontsize=7)
        ax.invert_yaxis()
        ax.axvline(30, color="#c33", ls="--", lw=1, label="seed's measured 30%")
        ax.set_xlabel("double-buffer saving at the seed point (%), simulated")
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        files = [path.with_suffix(".png"), path.with_suffix(".svg")]
        for f in files:
            fig.savefig(f)
        plt.close(fig)
        return files


def _traces(schedule: Schedule, batch: int, seqlens: Sequence[int], buffers: int,
            schemes=SCHEMES, dry=emulator_dry_run) -> dict:
    from ...errors import MlagenError

    s = _with_buffers(schedule, buffers)
    inp = dry_inputs(s, batch, list(seqlens))
    out = {}
    for sc in schemes:
        try:
            out[sc] = dry(s, inp, sc)
        except MlagenError:
            pass
    return out


def saving_range(schedule=None, batch: int = SEED["batch"], seqlen: int = SEED["seqlen"],
                 readings=READINGS, buffers=(1, 2, 3)) -> SavingRange:
    """The seed point's times under every reading, with the default reading's best
    double-buffered scheme (the traces do not depend on the machine)."""
    sched = _schedule(schedule)
    tr = {nb: _traces(sched, batch, [seqlen] * batch, nb) for nb in buffers}
    base = machine_for(sched)
    t2 = {sc: simulate(t, base).total_s for sc, t in tr[2].items()}
    scheme = min(t2, key=t2.get)
    res = SavingRange(sched.name, scheme, batch, seqlen)
    for param, label, f in readings:
        mc = f(base)
        sims = {nb: simulate(tr[nb][scheme], mc) for nb in buffers}
        res.rows.append(RangeRow(param, label, {nb: s.total_s for nb, s in sims.items()},
                                 floor_s(sims[2])))
    return res


# ---------------------------------------------------------------------------------------
# auto's regret
# ---------------------------------------------------------------------------------------
@dataclass
class Regret:
    rows: list = field(default_factory=list)   # (batch, seqlen, reading, pick, best, regret)

    def worst(self):
        return max(self.rows, key=lambda r: r[5])

    def markdown(self) -> str:
        w = self.worst()
        per = {}
        for b, l, rd, pick, best, rg in self.rows:
            if rg > per.get(rd, (0, None))[0]:
                per[rd] = (rg, (b, l, pick, best))
        out = ["| reading | worst regret | at (batch, seqlen) | auto's pick | best there |",
               "|---|---|---|---|---|"]
        for rd, (rg, where) in per.items():
            if where is None:
                out.append(f"| {rd} | 0% | - | - | - |")
            else:
                out.append(f"| {rd} | {rg:.1%} | ({where[0]}, {where[1]}) | {where[2]} | "
                           f"{where[3]} |")
        zero = [rd for rd in {r[2] for r in self.rows} if rd not in per]
        out += [f"| {rd} | 0% | - | - | - |" for rd in sorted(zero)]
        out += ["", f"**auto's worst regret: {w[5]:.1%}** (batch {w[0]}, seqlen {w[1]}, "
                f"reading '{w[2]}': auto runs {w[3]}, {w[4]} is best there)."]
        return "\n".join(out)


def auto_regret(schedule=None, batches=(1, 4, 16, 128), seqlens=(128, 1024, 4096),
                readings=READINGS, progress: Optional[Callable[[str], None]] = None) -> Regret:
    """auto picks with the default reading (what it would do on the card, not knowing the
    truth); judged under each reading by t(pick) / t(best under that reading) - 1."""
    sched = _schedule(schedule)
    base = machine_for(sched)
    reg = Regret()
    for b in batches:
        for L in seqlens:
            tr = _traces(sched, b, [L] * b, 2)
            t0 = {sc: simulate(t, base).total_s for sc, t in tr.items()}
            pick = min(t0, key=lambda k: (t0[k], SCHEMES.index(k)))
            for param, label, f in readings:
                mc = f(base)
                t = t0 if param == "default" else \
                    {sc: simulate(x, mc).total_s for sc, x in tr.items()}
                best = min(t, key=lambda k: (t[k], SCHEMES.index(k)))
                reg.rows.append((b, L, f"{param}: {label}", pick, best, t[pick] / t[best] - 1))
            if progress:
                progress(f"regret: batch {b} seqlen {L} done")
    return reg


# ---------------------------------------------------------------------------------------
# The card: two chips
# ---------------------------------------------------------------------------------------
@dataclass
class CardReport:
    heads_split: float          # each chip its 16 heads, every sequence (KV replicated)
    batch_split: float          # each chip all 32 heads, half the sequences
    one_chip: float             # the card's 32 heads on one chip (the old stand-in)
    gather_s: float             # CDMA: one chip's outputs to the other, if they must meet
    floors: dict

    def markdown(self, batch: int, seqlen: int) -> str:
        return "\n".join([
            f"batch {batch}, seqlen {seqlen}, fused, 32 heads a card (tp = 4 over cards), "
            "double-buffered, best scheme per chip:", "",
            "| mapping of the card | card time (us) | floor (us) | / floor |",
            "|---|---|---|---|",
            f"| one chip does all 32 heads (previous stand-in) | {self.one_chip * US:.1f} | "
            f"{self.floors['one'] * US:.1f} | {self.one_chip / self.floors['one']:.2f} |",
            f"| two chips, 16 heads each, all sequences (KV on both chips) | "
            f"{self.heads_split * US:.1f} | {self.floors['heads'] * US:.1f} | "
            f"{self.heads_split / self.floors['heads']:.2f} |",
            f"| two chips, 32 heads each, half the sequences each | {self.batch_split * US:.1f}"
            f" | {self.floors['batch'] * US:.1f} | {self.batch_split / self.floors['batch']:.2f}"
            f" |",
            "",
            f"Chip-to-chip: with heads split, neither chip needs the other's data inside the "
            f"operator (each reads the latent KV from its own DDR; the o_proj all-reduce "
            f"after it spans all chips anyway).  If one chip's outputs had to be gathered on "
            f"the other, CDMA adds {self.gather_s * US:.1f} us (batch x 16 heads x 128 x 2 B "
            f"at 11.2 GB/s + 0.25 us), more than the split saves."])


def card_report(batch: int = SEED["batch"], seqlen: int = SEED["seqlen"]) -> CardReport:
    from .. import load_target

    one = _schedule(None)                                   # tp 4: 32 heads on one chip
    half = one.replace(tp=8)                                # 16 heads a chip
    t = load_target("sc11")

    def best(s: Schedule, b: int):
        tr = _traces(s, b, [seqlen] * b, 2)
        mc = machine_for(s)
        sims = {sc: simulate(x, mc) for sc, x in tr.items()}
        k = min(sims, key=lambda k: sims[k].total_s)
        return sims[k].total_s, floor_s(sims[k])

    t_one, f_one = best(one, batch)
    t_heads, f_heads = best(half, batch)
    t_batch, f_batch = best(one, -(-batch // 2))
    out_bytes = batch * 16 * one.problem.v_head_dim * 2
    gather = float(t.cdma_latency_s) + out_bytes / float(t.cdma_bw)
    return CardReport(t_heads, t_batch, t_one, gather,
                      {"one": f_one, "heads": f_heads, "batch": f_batch})
