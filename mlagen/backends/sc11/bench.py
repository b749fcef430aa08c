"""The SC11 benchmark: the seed's Table 2 as it should have been, and its 30% claim.

    bench_grid(schedule)   batch {1..128} x seqlen {128..16384}: every scheme's simulated
                           time with single and double buffering, the best, auto's pick
    seed_point(schedule)   batch 128, seqlen 512: double vs single buffering, the pipelined
                           bound, which engine dominates, and the timeline charts

Traces come from the emulator in dry mode (same control flow and trace as a real run, no
data), so the grid's large points cost only the simulation.  Every number is simulated time
of the cost model (costmodel.py) on targets/sc11.toml; parameters marked "assumed" there are
named in the report.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from ... import kvformat
from ...errors import MlagenError, ScheduleError
from ...paths import DATA_ROOT, SCHEDULES_DIR
from ...problem import TORCH_DTYPES, FusedWeights, MlaInputs
from ...schedule import check, load
from ...schedule.records import Schedule
from .costmodel import simulate
from .floors import floor_s, floors_table
from .schemes import SCHEMES, choose_scheme, machine_for
from .timeline import text_summary
from .trace import Engine, Op

BATCHES = (1, 4, 8, 16, 32, 64, 128)
SEQLENS = (128, 512, 1024, 4096, 16384)
DEFAULT_SCHEDULE = SCHEDULES_DIR / "sc11_fused_tp4.toml"
SEED = dict(batch=128, seqlen=512)

# dry(schedule, inputs, scheme) -> trace (EVENT_DTYPE array)
DryRun = Callable[[Schedule, MlaInputs, str], np.ndarray]


# ---------------------------------------------------------------------------------------
# Inputs and traces
# ---------------------------------------------------------------------------------------
def dry_inputs(schedule: Schedule, batch: int, seqlens: Sequence[int], s_q: int = 1
               ) -> MlaInputs:
    """Inputs of the right shapes for a dry run.  The cache is torch.empty: its pages are
    never touched in dry mode, so even 128 x 16384 tokens cost no memory."""
    p = schedule.problem
    dtype = TORCH_DTYPES[p.dtype]
    h = schedule.heads_per_device
    page = p.page_size
    need = [max(1, -(-int(s) // page)) for s in seqlens]
    max_blocks = max(need)
    table = torch.zeros(batch, max_blocks, dtype=torch.int32)
    pos = 0
    for i, k in enumerate(need):
        table[i, :k] = torch.arange(pos, pos + k, dtype=torch.int32)
        pos += k
    fmt = kvformat.get(p.kv)
    cache = torch.empty(pos, page, 1, fmt.width(p.kv_lora_rank, p.rope_dim),
                        dtype=kvformat.FP8 if fmt.quantized else dtype)
    descale = torch.ones(1) if fmt.needs_descale else None
    seq = torch.tensor([int(s) for s in seqlens], dtype=torch.int32)
    meta = dict(batch=batch, seqlens=[int(s) for s in seqlens], s_q=s_q, heads=h, dry=True)
    if p.fused:
        nope, rope, r = p.qk_nope_head_dim, p.rope_dim, p.q_lora_rank
        w = FusedWeights(w_uq=torch.zeros(r, h, nope + rope, dtype=dtype),
                         w_uk=torch.zeros(h, nope, p.kv_lora_rank, dtype=dtype),
                         w_uv=torch.zeros(h, p.kv_lora_rank, p.v_head_dim, dtype=dtype))
        return MlaInputs(None, cache, table, seq, p.default_scale(), p.causal,
                         q_lora=torch.zeros(batch, s_q, r, dtype=dtype), weights=w, meta=meta,
                         kv_format=p.kv, k_descale=descale)
    q = torch.zeros(batch, s_q, h, p.d, dtype=dtype)
    return MlaInputs(q, cache, table, seq, p.default_scale(), p.causal, meta=meta,
                     kv_format=p.kv, k_descale=descale)


_RUNNERS: dict = {}


def emulator_dry_run(schedule: Schedule, inputs: MlaInputs, scheme: str) -> np.ndarray:
    """The emulator's trace of `inputs` under `scheme`, in dry mode (one build per variant)."""
    from . import runner  # the emulator's runner (mlagen/backends/sc11/emulator.py)

    key = (schedule.variant_name(), schedule.target.file)
    if key not in _RUNNERS:
        _RUNNERS[key] = runner(schedule)
    return _RUNNERS[key].dry_run(inputs, scheme)


# ---------------------------------------------------------------------------------------
# One grid point
# ---------------------------------------------------------------------------------------
@dataclass
class Point:
    batch: int
    seqlen: int
    times: dict = field(default_factory=dict)     # buffers -> {scheme: seconds}
    refused: dict = field(default_factory=dict)   # buffers -> {scheme: why}
    auto: dict = field(default_factory=dict)      # buffers -> scheme auto picked
    bound: dict = field(default_factory=dict)     # buffers -> bound seconds (best scheme)
    dominant: dict = field(default_factory=dict)  # buffers -> dominant engine (best scheme)
    seconds: float = 0.0                          # wall time spent on this point

    def best(self, buffers: int) -> tuple:
        t = self.times[buffers]
        s = min(t, key=lambda k: (t[k], SCHEMES.index(k)))
        return s, t[s]

    def saving(self, single: int = 1, double: int = 2) -> float:
        """1 - best double-buffered time / best single-buffered time."""
        return 1.0 - self.best(double)[1] / self.best(single)[1]

    def auto_excess(self, buffers: int) -> float:
        """auto's time / the best time - 1."""
        return self.times[buffers][self.auto[buffers]] / self.best(buffers)[1] - 1.0


def _with_buffers(schedule: Schedule, buffers: int) -> Schedule:
    s = schedule.replace(buffers=buffers, scheme="auto")
    check(s)
    return s


def run_point(schedule: Schedule, batch: int, seqlen: int, buffers=(1, 2),
              dry: DryRun = emulator_dry_run, keep: bool = False):
    """Every scheme at every buffer count; with keep, also {(buffers, scheme): SimResult}."""
    t0 = time.perf_counter()
    pt = Point(batch, seqlen)
    sims = {}
    inputs = dry_inputs(schedule, batch, [seqlen] * batch)
    for nb in buffers:
        sched = _with_buffers(schedule, nb)
        mc = machine_for(sched)
        traces, why, res = {}, {}, {}
        for s in SCHEMES:
            try:
                traces[s] = dry(sched, inputs, s)
            except MlagenError as e:
                why[s] = str(e).splitlines()[0]
                continue
            res[s] = simulate(traces[s], mc)
        if not res:
            raise MlagenError(f"batch {batch} seqlen {seqlen} buffers {nb}: no scheme runs: "
                              f"{why}")
        pt.times[nb] = {s: r.total_s for s, r in res.items()}
        pt.refused[nb] = why

        def again(s, traces=traces, why=why):
            if s in why:
                raise MlagenError(why[s])
            return traces[s]

        # what "auto" picks: choose_scheme on the same dry-run traces
        pt.auto[nb], _ = choose_scheme(sched, inputs, again)
        best = pt.best(nb)[0]
        pt.bound[nb] = res[best].bound_s
        pt.dominant[nb] = res[best].dominant_engine().name
        if keep:
            sims.update({(nb, s): r for s, r in res.items()})
        del traces, res
    pt.seconds = time.perf_counter() - t0
    return (pt, sims) if keep else pt


# ---------------------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------------------
@dataclass
class Grid:
    schedule: str
    points: list
    buffers: tuple
    assumed: list
    seconds: float = 0.0
    kv_format: str = "bf16"

    def cells(self) -> tuple[list, list]:
        """The grid as (column names, rows of strings): markdown() and the terminal's
        table (mlagen.console.table) show the same cells."""
        nb2, nb1 = max(self.buffers), min(self.buffers)
        us = 1e6
        head = (["batch", "seqlen", "best", "time (us)"] + list(SCHEMES) +
                [f"best, {nb1} buffer (us)", "saving", "time / bound", "dominant", "auto"])
        rows = []
        for p in self.points:
            best, t = p.best(nb2)
            cells = [f"{p.times[nb2][s] * us:.1f}" if s in p.times[nb2] else "n/a"
                     for s in SCHEMES]
            b1, t1 = p.best(nb1)
            auto = p.auto[nb2]
            auto_s = auto if auto == best else f"{auto} (+{p.auto_excess(nb2):.1%})"
            rows.append([str(p.batch), str(p.seqlen), best, f"{t * us:.1f}", *cells,
                         f"{t1 * us:.1f} ({b1})", f"{p.saving(nb1, nb2):.0%}",
                         f"{t / p.bound[nb2]:.2f}", p.dominant[nb2], auto_s])
        return head, rows

    def markdown(self) -> str:
        head, rows = self.cells()
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(f"**{c}**" if i == 2 else c for i, c in enumerate(r))
                  + " |" for r in rows]
        return "\n".join(lines)

    def best_map(self) -> str:
        """A compact batch x seqlen map of the best scheme (double buffered)."""
        nb2 = max(self.buffers)
        seqlens = sorted({p.seqlen for p in self.points})
        batches = sorted({p.batch for p in self.points})
        by = {(p.batch, p.seqlen): p for p in self.points}
        rows = ["| batch \\ seqlen | " + " | ".join(map(str, seqlens)) + " |",
                "|---|" + "---|" * len(seqlens)]
        for b in batches:
            rows.append(f"| {b} | " + " | ".join(
                by[(b, s)].best(nb2)[0] if (b, s) in by else "" for s in seqlens) + " |")
        return "\n".join(rows)

    def auto_ok(self, tol: float = 0.05) -> bool:
        nb2 = max(self.buffers)
        return all(p.auto_excess(nb2) <= tol for p in self.points)


def _shown(path) -> str:
    """A path as reports print it: relative to the project when inside it."""
    p = Path(path).resolve()
    return str(p.relative_to(DATA_ROOT)) if p.is_relative_to(DATA_ROOT) else str(p)


def _schedule(schedule) -> Schedule:
    if schedule is None:
        schedule = DEFAULT_SCHEDULE
    if isinstance(schedule, (str, Path)):
        s = load(schedule)
        # name the file relative to the project in reports, so they read the same anywhere
        if Path(schedule).resolve().is_relative_to(DATA_ROOT):
            s = dataclasses.replace(s, source=str(Path(schedule).resolve()
                                                  .relative_to(DATA_ROOT)))
        return s
    return schedule


def bench_grid(schedule=None, batches=BATCHES, seqlens=SEQLENS, buffers=(1, 2),
               out: Optional[Path] = None, dry: DryRun = emulator_dry_run,
               progress: Optional[Callable[[str], None]] = None) -> Grid:
    """The grid; with `out`, writes its markdown there."""
    sched = _schedule(schedule)
    t0 = time.perf_counter()
    pts = []
    for b in batches:
        for s in seqlens:
            pt = run_point(sched, b, s, buffers, dry)
            pts.append(pt)
            if progress:
                best, t = pt.best(max(buffers))
                progress(f"batch {b:4d} seqlen {s:6d}: {best:<9} {t * 1e6:9.1f} us "
                         f"({pt.seconds:.1f} s)")
    g = Grid(sched.source or sched.name, pts, tuple(buffers),
             machine_assumed(sched), time.perf_counter() - t0, sched.problem.kv)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(grid_report(g))
    return g


def machine_assumed(schedule: Schedule) -> list:
    from .. import load_target

    base = Path(schedule.source).parent if schedule.source else None
    t = load_target(schedule.target.kind, schedule.target.file, base)
    return [f"{k} = {t.params[k]}" for k in t.assumed()]


def grid_report(g: Grid) -> str:
    return "\n".join([
        f"# SC11 multi-core schemes by batch and sequence length (simulated, KV cache "
        f"{g.kv_format})",
        "",
        f"Schedule {g.schedule}, KV cache {g.kv_format}; fused MLA decode, 32 heads per card, "
        f"one chip (8 cores), "
        f"s_q 1, every sequence of the batch the same length.  Times are the cost model's "
        f"simulated time of the emulator's dry-run trace, in microseconds; buffers "
        f"{max(g.buffers)} unless named.  `saving` = 1 - best({max(g.buffers)} buffers) / "
        f"best({min(g.buffers)} buffer); `time / bound` against max(DDR bytes / chip DDR "
        f"bandwidth, FLOPs / peak).",
        "",
        "Assumed target parameters (targets/sc11.toml): " + ", ".join(g.assumed) + ".",
        "",
        "## Best scheme",
        "",
        g.best_map(),
        "",
        "## Every scheme",
        "",
        g.markdown(),
        "",
        f"auto within 5% of the best at every point: {'yes' if g.auto_ok() else 'NO'}.  "
        f"Grid took {g.seconds:.0f} s.",
        "",
    ])


# ---------------------------------------------------------------------------------------
# The seed's point
# ---------------------------------------------------------------------------------------
@dataclass
class SeedReport:
    point: Point
    sims: dict                      # (buffers, scheme) -> SimResult
    scheme: str                     # the best double-buffered scheme
    single: float
    double: float
    pipelined: float
    saving: float
    files: list = field(default_factory=list)
    kv_format: str = "bf16"

    @property
    def within_bound(self) -> float:
        """double-buffered time / pipelined bound - 1."""
        return self.double / self.pipelined - 1.0

    @property
    def floor(self) -> float:
        """The double-buffered run's hardware floor (ranges.phase_floors, added)."""
        return floor_s(self.sims[(2, self.scheme)])

    def checks(self) -> dict:
        # no calibrated saving is asserted: the saving is a range over the assumed readings
        # (ranges.saving_range); what must hold is the mechanism and the bounds
        return {"double buffering saves time": self.saving > 0.0,
                "double-buffered within 15% of the pipelined bound": self.within_bound <= 0.15,
                "auto within 5% of the best (same reading)": self.point.auto_excess(2) <= 0.05}

    def sensitivity(self, factors=(0.5, 2.0)) -> list:
        """The seed's saving and distance to the pipelined bound with each assumed machine
        parameter scaled: [(param, factor, saving, double / pipelined - 1)]."""
        mc = self.sims[(2, self.scheme)].machine
        ev1, ev2 = self.sims[(1, self.scheme)].events, self.sims[(2, self.scheme)].events
        knobs = {"sdma_bw": "sdma_bw", "l2_bw": "l2_bw", "issue_cycles": "issue",
                 "barrier_s": "barrier_s", "l2_latency_s": None}
        rows = []
        for name, field_ in knobs.items():
            for f in factors:
                if field_ is None:
                    lat = list(mc.latency)
                    lat[2] *= f
                    m2 = mc.replace(latency=tuple(lat))
                else:
                    v = getattr(mc, field_) * f
                    m2 = mc.replace(**{field_: int(round(v)) if field_ == "issue" else v})
                a, b = simulate(ev1, m2), simulate(ev2, m2)
                rows.append((name, f, 1 - b.total_s / a.total_s,
                             b.total_s / b.pipelined_bound_s() - 1))
        return rows

    def text(self) -> str:
        us = 1e6
        d = self.sims[(2, self.scheme)]
        s1 = self.sims[(1, self.scheme)]
        lines = [f"## The seed's point: batch {self.point.batch}, seqlen {self.point.seqlen}, "
                 f"32 heads per card, KV cache {self.kv_format}", "",
                 f"best scheme (double buffered): {self.scheme}", "",
                 "| scheme | 1 buffer (us) | 2 buffers (us) | saving |", "|---|---|---|---|"]
        for s in SCHEMES:
            if (1, s) in self.sims and (2, s) in self.sims:
                a, b = self.sims[(1, s)].total_s, self.sims[(2, s)].total_s
                lines.append(f"| {s} | {a * us:.1f} | {b * us:.1f} | {1 - b / a:.1%} |")
        lines += ["",
                  f"saving of double buffering ({self.scheme}): {self.saving:.1%} "
                  f"(seed: 30%)",
                  f"pipelined bound: {self.pipelined * us:.1f} us; double-buffered time is "
                  f"{self.within_bound:+.1%} from it",
                  f"hardware floor (per segment: DDR bytes / chip DDR bandwidth, FLOPs / "
                  f"cube peak): {self.floor * us:.1f} us; double-buffered time is "
                  f"{self.double / self.floor:.2f}x it",
                  "", _floors(self.sims[(2, self.scheme)]),
                  "", "checks:"]
        lines += [f"- {k}: {'ok' if v else 'MISSED'}" for k, v in self.checks().items()]
        lines += ["", "sensitivity to the assumed parameters (each scaled alone):", "",
                  "| parameter | x | saving | double / pipelined bound |", "|---|---|---|---|"]
        lines += [f"| {n} | {f:g} | {sv:.1%} | {wb:+.1%} |" for n, f, sv, wb in
                  self.sensitivity()]
        lines += ["", "### double buffered", "", "```", text_summary(d), "```",
                  "", "### single buffered", "", "```", text_summary(s1), "```"]
        if self.files:
            lines += ["", "charts: " + ", ".join(_shown(f) for f in self.files)]
        return "\n".join(lines)


def _floors(sim) -> str:
    return floors_table(sim)


def seed_point(schedule=None, dry: DryRun = emulator_dry_run, charts: Optional[Path] = None,
               batch: int = SEED["batch"], seqlen: int = SEED["seqlen"]) -> SeedReport:
    sched = _schedule(schedule)
    pt, sims = run_point(sched, batch, seqlen, (1, 2), dry, keep=True)
    scheme = pt.best(2)[0]
    d, s = sims[(2, scheme)], sims[(1, scheme)]
    rep = SeedReport(pt, sims, scheme, s.total_s, d.total_s, d.pipelined_bound_s(),
                     1.0 - d.total_s / s.total_s, kv_format=sched.problem.kv)
    if charts is not None:
        from .timeline import plot_all, plot_core
        charts = Path(charts)
        for nb in (1, 2):
            r = sims[(nb, scheme)]
            tag = "" if sched.problem.kv == sched.problem.dtype else f"_{sched.problem.kv}"
            rep.files += plot_core(r, 0, charts / f"seed{tag}_{scheme}_buf{nb}_core0", by="op")
            rep.files += plot_all(r, charts / f"seed{tag}_{scheme}_buf{nb}_all")
    return rep


def with_kv_format(schedule: Schedule, name: str) -> Schedule:
    """The schedule with its KV cache in format `name` (checked; MlagenError if the target
    or the problem does not take it)."""
    kvformat.get(name)
    p = schedule.problem
    s = schedule.replace(kv_format="" if name == p.dtype else name)
    try:
        check(s)
    except ScheduleError as e:
        raise MlagenError(f"--kv-format {name}: {str(e).splitlines()[0]}") from None
    return s


def kv_formats_of(schedule: Schedule, arg: Optional[str]) -> list:
    """The formats `bench` compares: the --kv-format list, or the schedule's dtype and
    fp8_e4m3 (and the schedule's own format when it is another)."""
    if arg:
        names = [n.strip() for n in arg.split(",") if n.strip()]
        if not names:
            raise MlagenError("--kv-format: give one or more formats, comma-separated")
    else:
        names = [schedule.problem.dtype, "fp8_e4m3", schedule.problem.kv]
    return list(dict.fromkeys(names))


def formats_table(seeds: Sequence[SeedReport]) -> str:
    """The seed's point in each KV format: time, floor, the bytes SDMA moved and the BDC's
    dequantization, each beside the first format's."""
    us = 1e6
    rows = ["| KV format | bytes a token | best scheme | 2 buffers (us) | vs first | floor (us) "
            "| time / floor | SDMA gathers (MB) | BDC dequant (us a core) |",
            "|---|---|---|---|---|---|---|---|---|"]
    base = seeds[0].double if seeds else 0.0
    for sd in seeds:
        sim = sd.sims[(2, sd.scheme)]
        ev = sim.events
        gather = (ev["engine"] == Engine.SDMA) & (ev["op"] == Op.DMA)
        deq = ev["op"] == Op.DEQUANT
        deq_us = float((sim.end[deq] - sim.start[deq]).sum()) / max(1, len(sim.cores)) * us
        fmt = kvformat.get(sd.kv_format)
        rows.append(f"| {sd.kv_format} | {fmt.token_bytes()} | {sd.scheme} | "
                    f"{sd.double * us:.1f} | {sd.double / base:.2f}x | {sd.floor * us:.1f} | "
                    f"{sd.double / sd.floor:.2f} | {int(ev['bytes'][gather].sum()) / 1e6:.2f} | "
                    f"{deq_us:.1f} |")
    return "\n".join(rows)


def bench_main(args) -> int:
    """`mlagen bench --target sc11`: the seed point, then the grid (args: schedule, output,
    quick, and optionally charts / no_grid); writes the markdown report to `output`.

    On a terminal the results are rich tables and the grid's rows advance a progress bar;
    piped, the same markdown as the report file (and one line per row on stderr)."""
    import sys

    from ...console import progress_rows, status, table

    if getattr(args, "flashmla", None):
        raise MlagenError("--flashmla: target sc11 has no FlashMLA reference to time")
    if getattr(args, "vllm_fp8", None):
        raise MlagenError("--vllm-fp8: target sc11 has no vLLM kernel to time")
    if getattr(args, "fp8_mma", None):
        raise MlagenError("--fp8-mma: another target's knob; sc11's FP8 schedules say their "
                          "own")
    if getattr(args, "shape", None):
        raise MlagenError("--shape: target sc11's bench is its scheme grid (batch x seqlen); "
                          "`mlagen run SCHEDULE --batch B --seqlen S` times one point")
    tty = sys.stdout.isatty()
    charts = getattr(args, "charts", None)
    base = _schedule(args.schedule)
    scheds = [with_kv_format(base, n) for n in kv_formats_of(base, getattr(args, "kv_format",
                                                                            None))]
    seeds = []
    for sched in scheds:
        with status(f"mlagen: bench sc11: the seed's point (batch {SEED['batch']}, seqlen "
                    f"{SEED['seqlen']}, KV cache {sched.problem.kv}), every scheme at 1 and 2 "
                    f"buffers ..."):
            seeds.append(seed_point(sched, charts=Path(charts) if charts else None))
        if tty:
            _show_seed(seeds[-1], table)
        else:
            print(seeds[-1].text())
            print()
    parts = [sd.text() for sd in seeds]
    if len(seeds) > 1:
        cmp = ("## The seed's point by KV-cache format\n\n" + formats_table(seeds))
        print(cmp)
        parts.append(cmp)
    # the token-sparse example schedules at their decode points (--quick: batch 2 only)
    from .sparse_bench import POINTS, sparse_rows, sparse_table

    with status("mlagen: bench sc11: token-sparse decode points ..."):
        sparse = sparse_table(sparse_rows([pt for pt in POINTS
                                           if not args.quick or pt[1] <= 2]))
    print(sparse)
    print()
    parts.append(sparse)
    if not getattr(args, "no_grid", False):
        kw = dict(batches=(1, 16, 128), seqlens=(128, 1024, 16384)) if args.quick else {}
        n = len(kw.get("batches", BATCHES)) * len(kw.get("seqlens", SEQLENS))
        grids = []
        # --quick: the grid of the first format only (the seed point covers every one)
        for sched in scheds[:1] if args.quick else scheds:
            with progress_rows(n, f"bench sc11 grid ({sched.problem.kv})",
                               bar=not getattr(args, "no_progress", False)) as advance:
                g = bench_grid(sched, progress=advance, **kw)
            grids.append(grid_report(g))
            if tty:      # the best of each point; every scheme's time is in the report
                head, rows = g.cells()
                keep = [i for i, h in enumerate(head) if h not in SCHEMES]
                table([head[i] for i in keep], [[r[i] for i in keep] for r in rows],
                      title=f"SC11, best scheme by batch x seqlen (simulated, "
                            f"{max(g.buffers)} buffers, KV cache {g.kv_format})",
                      right=(0, 1, 3, 4, 5, 6))
            else:
                print(f"KV cache {g.kv_format}:")
                print(g.best_map())
                print()
                print(g.markdown())
        parts[:0] = grids
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n\n".join(parts) + "\n")
        print(f"\nwritten: {out}", file=sys.stderr)
    elif tty:
        print("(the full report, with timelines and sensitivity: --output FILE)")
    return 0 if all(all(sd.checks().values()) for sd in seeds) else 1


def _show_seed(seed: SeedReport, table) -> None:
    us = 1e6
    rows = []
    for s in SCHEMES:
        if (1, s) in seed.sims and (2, s) in seed.sims:
            a, b = seed.sims[(1, s)].total_s, seed.sims[(2, s)].total_s
            rows.append((s + (" (best)" if s == seed.scheme else ""), f"{a * us:.1f}",
                         f"{b * us:.1f}", f"{1 - b / a:.1%}"))
    table(("scheme", "1 buffer (us)", "2 buffers (us)", "saving"), rows, right=(1, 2, 3),
          title=f"The seed's point: batch {seed.point.batch}, seqlen {seed.point.seqlen}")
    print(f"pipelined bound {seed.pipelined * us:.1f} us; double-buffered time is "
          f"{seed.within_bound:+.1%} from it")
    for k, v in seed.checks().items():
        print(f"  {'ok    ' if v else 'MISSED'} {k}")
