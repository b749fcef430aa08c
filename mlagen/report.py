"""`mlagen run`: build a schedule's kernel, run it on a random workload, compare with the
reference and report (SC11: simulated time, timeline summary and Gantt charts)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional

import torch

from . import console
from .console import human_bytes, status
from .errors import MlagenError
from .schedule.records import SC11_SCHEMES, Schedule

DEFAULTS = {"sc11": (128, 512), "hopper": (64, 4096)}   # (batch, seqlen): the seed's point
MAX_SEQLEN = 2 ** 31 - 1                                   # cache_seqlens are int32


def workload_bytes(schedule: Schedule, batch: int, max_len: int, s_q: int) -> tuple[int, int]:
    """(host, device) bytes a `mlagen run` of this size needs at its peak, counted before
    anything is allocated: the paged cache (drawn in float32, kept in the kernel's dtype),
    queries, outputs, the float64 reference's outputs and one gathered chunk, and the SC11
    trace.  An estimate from above; it only has to say "this cannot fit"."""
    p = schedule.problem
    h = schedule.heads_per_device
    elt = 2                                            # bf16 / fp16
    pages = batch * max(1, -(-max_len // p.page_size)) + 2
    cache = pages * p.page_size * p.d
    q = batch * s_q * (p.q_lora_rank if p.fused else h * p.d)
    width = p.v_head_dim if p.fused else p.dv
    out = batch * s_q * h * (width + 1)
    inputs = (cache + q) * elt
    host = (cache + q) * (4 + elt) + out * (elt + 8 * 3) + (256 << 20) * 3
    if schedule.target.name == "sc11":
        host += batch * max_len * 64                   # trace events and their simulation
        return host, 0
    return host, inputs + out * (elt + 4)


def _available_host() -> int:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62   # unknown: do not refuse


def check_fits(schedule: Schedule, batch: int, max_len: int, s_q: int) -> None:
    """Refuse a workload that cannot fit in memory, before allocating any of it."""
    host, device = workload_bytes(schedule, batch, max_len, s_q)
    free = _available_host()
    if host > free:
        raise MlagenError(f"batch {batch} x seqlen {max_len} needs about {human_bytes(host)} "
                          f"of memory; {human_bytes(free)} is available (use a smaller "
                          f"--batch or --seqlen)")
    if device:
        free_dev = torch.cuda.mem_get_info()[0]
        if device > free_dev:
            raise MlagenError(f"batch {batch} x seqlen {max_len} needs about "
                              f"{human_bytes(device)} of GPU memory; {human_bytes(free_dev)} "
                              f"is free (use a smaller --batch or --seqlen)")


def _lengths(batch: int, seqlen: int, varlen: bool, seed: int) -> list[int]:
    if not varlen:
        return [seqlen] * batch
    g = torch.Generator().manual_seed(seed)
    lens = torch.normal(float(seqlen), seqlen / 2, (batch,), generator=g)
    return [min(3 * seqlen, max(1, int(x))) for x in lens]   # 3x: what check_fits counts


def run_report(schedule: Schedule, batch: Optional[int] = None, seqlen: Optional[int] = None,
               s_q: int = 1, seed: int = 0, scheme: Optional[str] = None,
               chart: Optional[str] = None, varlen: bool = False) -> int:
    from . import runner
    from .backends import require_device
    from .problem import make_inputs
    from .verify.compare import compare
    from .verify.oracle import oracle_for

    kind = schedule.target.name
    b0, l0 = DEFAULTS[kind]
    batch = b0 if batch is None else batch
    seqlen = l0 if seqlen is None else seqlen
    for name, v in (("--batch", batch), ("--seqlen", seqlen), ("--s-q", s_q)):
        if v < 1:
            raise MlagenError(f"{name} must be at least 1, got {v}")
    if s_q > schedule.problem.max_s_q:
        raise MlagenError(f"--s-q {s_q} is more than the schedule's max_s_q = "
                          f"{schedule.problem.max_s_q}")
    if scheme is not None:             # before the build: a typo should not cost one
        if kind != "sc11":
            raise MlagenError(f"--scheme picks an SC11 phase-B scheme; target {kind} has none")
        if scheme not in SC11_SCHEMES:
            raise MlagenError(f"--scheme {scheme!r} must be one of {', '.join(SC11_SCHEMES)}")
    if seqlen > MAX_SEQLEN:
        raise MlagenError(f"--seqlen {seqlen} is more than {MAX_SEQLEN} (int32 lengths)")
    device = "cuda" if kind == "hopper" else "cpu"
    require_device(schedule)
    # varlen draws around seqlen (sd seqlen / 2), clipped to 3 x seqlen
    check_fits(schedule, batch, min(3 * seqlen, MAX_SEQLEN) if varlen else seqlen, s_q)
    print(f"schedule {schedule.name} ({schedule.variant_name()})")
    print(f"workload batch {batch}, seqlen {seqlen}{' (varlen)' if varlen else ''}, s_q {s_q}, "
          f"{schedule.heads_per_device} heads per device, "
          f"{'fused' if schedule.problem.fused else 'attention only'}, {schedule.problem.dtype}",
          flush=True)
    t0 = time.perf_counter()
    run = runner(schedule)             # the build says what it does (mlagen.console)
    t_build = time.perf_counter() - t0
    print(f"kernel ready in {t_build:.2f} s", flush=True)
    with status("mlagen: drawing the workload ...", console.PROGRESS) as st:
        lens = _lengths(batch, seqlen, varlen, seed)
        inp = make_inputs(schedule.problem, batch, lens, s_q=s_q,
                          heads=schedule.heads_per_device, seed=seed, device=device)
        st.update("mlagen: running the kernel" +
                  (" on the SC11 emulator ..." if kind == "sc11" else " ..."))
        t0 = time.perf_counter()
        out = run(inp, scheme=scheme) if kind == "sc11" else run(inp)
        t_run = time.perf_counter() - t0
        st.update("mlagen: computing the float64 reference ...")
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
    print(f"LMEM high-water {human_bytes(out.extra['lmem_high'])} per core, "
          f"L2 high-water {human_bytes(out.extra['l2_high'])}")
    print(text_summary(sim))
    prefix = Path(chart) if chart else Path("out") / schedule.name
    prefix.parent.mkdir(parents=True, exist_ok=True)
    files = plot_all(sim, prefix.with_name(prefix.name + "_all_cores"))
    files += plot_core(sim, int(sim.cores[0]), prefix.with_name(prefix.name + "_core0"))
    print("timeline charts: " + ", ".join(str(f) for f in files))
