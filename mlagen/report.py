"""`mlagen run`: build a schedule's kernel, run it on a random workload, compare with the
reference and report (SC11: simulated time, timeline summary and Gantt charts)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import torch

from .errors import MlagenError
from .schedule.records import Schedule

DEFAULTS = {"sc11": (128, 512), "hopper": (64, 4096)}   # (batch, seqlen): the seed's point


def _lengths(batch: int, seqlen: int, varlen: bool, seed: int) -> list[int]:
    if not varlen:
        return [seqlen] * batch
    g = torch.Generator().manual_seed(seed)
    lens = torch.normal(float(seqlen), seqlen / 2, (batch,), generator=g)
    return [max(1, int(x)) for x in lens]


def run_report(schedule: Schedule, batch: Optional[int] = None, seqlen: Optional[int] = None,
               s_q: int = 1, seed: int = 0, scheme: Optional[str] = None,
               chart: Optional[str] = None, varlen: bool = False) -> int:
    from . import runner
    from .problem import make_inputs
    from .verify.compare import compare
    from .verify.oracle import oracle_for

    kind = schedule.target.name
    b0, l0 = DEFAULTS[kind]
    batch, seqlen = batch or b0, seqlen or l0
    if s_q > schedule.problem.max_s_q:
        raise MlagenError(f"--s-q {s_q} is more than the schedule's max_s_q = "
                          f"{schedule.problem.max_s_q}")
    device = "cuda" if kind == "hopper" else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise MlagenError("target hopper needs an NVIDIA GPU (none found); "
                          "`mlagen generate` and `mlagen build` work without one")
    t0 = time.perf_counter()
    run = runner(schedule)
    t_build = time.perf_counter() - t0
    lens = _lengths(batch, seqlen, varlen, seed)
    inp = make_inputs(schedule.problem, batch, lens, s_q=s_q, heads=schedule.heads_per_device,
                      seed=seed, device=device)
    print(f"schedule {schedule.name} ({schedule.variant_name()})")
    print(f"workload batch {batch}, seqlen {seqlen}{' (varlen)' if varlen else ''}, s_q {s_q}, "
          f"{schedule.heads_per_device} heads per device, "
          f"{'fused' if schedule.problem.fused else 'attention only'}, {schedule.problem.dtype}")
    print(f"kernel ready in {t_build:.2f} s")
    t0 = time.perf_counter()
    out = run(inp, scheme=scheme) if kind == "sc11" else run(inp)
    t_run = time.perf_counter() - t0
    t0 = time.perf_counter()
    # the verifier's oracle: float64 reference, rounded where the kernel stores bf16/fp16
    ref = oracle_for(schedule)(inp, dtype=torch.float64)
    t_ref = time.perf_counter() - t0
    result = compare(out, ref, schedule.problem.dtype)
    print(f"ran in {t_run:.3f} s (reference in torch float64: {t_ref:.3f} s)")
    print(f"check against the reference: {result.summary()}")
    if kind == "sc11":
        _sc11_report(schedule, out, chart)
    return 0 if result.ok else 1


def _sc11_report(schedule: Schedule, out, chart: Optional[str]) -> None:
    from .backends.sc11.costmodel import simulate
    from .backends.sc11.schemes import machine_for
    from .backends.sc11.timeline import plot_all, plot_core, text_summary

    sim = simulate(out.extra["trace"], machine_for(schedule))
    print(f"phase-B scheme: {out.extra['scheme']}")
    print(f"LMEM high-water {out.extra['lmem_high']} B, L2 high-water {out.extra['l2_high']} B")
    print(text_summary(sim))
    prefix = Path(chart) if chart else Path("out") / schedule.name
    prefix.parent.mkdir(parents=True, exist_ok=True)
    files = plot_all(sim, prefix.with_name(prefix.name + "_all_cores"))
    files += plot_core(sim, int(sim.cores[0]), prefix.with_name(prefix.name + "_core0"))
    print("timeline charts: " + ", ".join(str(f) for f in files))
