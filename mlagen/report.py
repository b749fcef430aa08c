"""`mlagen run`: build a schedule's kernel, run it on a random workload, compare with the
reference and report (the backend adds its own lines, e.g. a simulated timeline)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import torch

from .errors import MlagenError
from .schedule.rules import plan_of
from .schedule.records import Schedule


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

    plan = plan_of(schedule)
    be = plan.backend
    b0, l0 = be.run_point
    batch, seqlen = batch or b0, seqlen or l0
    if s_q > schedule.problem.max_s_q:
        raise MlagenError(f"--s-q {s_q} is more than the schedule's max_s_q = "
                          f"{schedule.problem.max_s_q}")
    why = be.device_check()
    if why:
        raise MlagenError(why)
    device = be.device
    t0 = time.perf_counter()
    run = runner(plan)
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
    out = run(inp, **be.run_kwargs(scheme))
    t_run = time.perf_counter() - t0
    t0 = time.perf_counter()
    # the verifier's oracle: float64 reference, rounded where the kernel stores bf16/fp16
    ref = oracle_for(plan)(inp, dtype=torch.float64)
    t_ref = time.perf_counter() - t0
    result = compare(out, ref, schedule.problem.dtype)
    print(f"ran in {t_run:.3f} s (reference in torch float64: {t_ref:.3f} s)")
    print(f"check against the reference: {result.summary()}")
    be.report(plan, out, chart)
    return 0 if result.ok else 1
