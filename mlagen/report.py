"""`mlagen run`: build a schedule's kernel, run it on a random workload, compare with the
reference and report (the backend adds its own lines, e.g. a simulated timeline)."""

from __future__ import annotations

import os
import time
from typing import Optional

import torch

from . import console
from .console import human_bytes, status
from .errors import MlagenError
from .schedule.rules import plan_of
from .schedule.records import Schedule

MAX_SEQLEN = 2 ** 31 - 1                                   # cache_seqlens are int32


def workload_bytes(schedule: Schedule, batch: int, max_len: int, s_q: int,
                   on_device: bool = False) -> tuple[int, int]:
    """(host, device) bytes a `mlagen run` of this size needs at its peak, counted before
    anything is allocated: the paged cache (drawn in float32, kept in the kernel's dtype),
    queries, outputs, the float64 reference's outputs and gathered chunks, and a trace
    allowance; device bytes only for a backend whose tensors live on a device.  An
    estimate from above: it only has to say "this cannot fit"."""
    p = schedule.problem
    h = schedule.heads_per_device
    elt = 2                                            # bf16 / fp16
    pages = batch * max(1, -(-max_len // p.page_size)) + 2
    cache = pages * p.page_size * p.d
    q = batch * s_q * (p.q_lora_rank if p.fused else h * p.d)
    width = p.v_head_dim if p.fused else p.dv
    out = batch * s_q * h * (width + 1)
    host = (cache + q) * (4 + elt) + out * (elt + 8 * 3) + (256 << 20) * 3 \
        + batch * max_len * 64                         # an emulator's trace and its simulation
    device = (cache + q) * elt + out * (elt + 4) if on_device else 0
    return host, device


def _available_host() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62   # unknown: do not refuse


def check_fits(schedule: Schedule, batch: int, max_len: int, s_q: int,
               on_device: bool = False) -> None:
    """Refuse a workload that cannot fit in memory, before allocating any of it."""
    host, device = workload_bytes(schedule, batch, max_len, s_q, on_device)
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
    from .problem import make_inputs, make_sparse_inputs
    from .verify.compare import compare
    from .verify.oracle import oracle_for

    plan = plan_of(schedule)
    be = plan.backend
    b0, l0 = be.run_point
    batch = b0 if batch is None else batch
    seqlen = l0 if seqlen is None else seqlen
    for name, v in (("--batch", batch), ("--seqlen", seqlen), ("--s-q", s_q)):
        if v < 1:
            raise MlagenError(f"{name} must be at least 1, got {v}")
    if s_q > schedule.problem.max_s_q:
        raise MlagenError(f"--s-q {s_q} is more than the schedule's max_s_q = "
                          f"{schedule.problem.max_s_q}")
    if seqlen > MAX_SEQLEN:
        raise MlagenError(f"--seqlen {seqlen} is more than {MAX_SEQLEN} (int32 lengths)")
    run_kw = be.run_kwargs(scheme)     # checks --scheme before the build costs a minute
    why = be.device_check()
    if why:
        raise MlagenError(why)
    device = be.device
    # varlen draws around seqlen (sd seqlen / 2), clipped to 3 x seqlen
    check_fits(schedule, batch, min(3 * seqlen, MAX_SEQLEN) if varlen else seqlen, s_q,
               on_device=device != "cpu")
    print(f"schedule {schedule.name} ({schedule.variant_name()})")
    print(f"workload batch {batch}, seqlen {seqlen}{' (varlen)' if varlen else ''}, s_q {s_q}, "
          f"{schedule.heads_per_device} heads per device, "
          f"{'fused' if schedule.problem.fused else 'attention only'}"
          + (f" (sparse, topk {schedule.problem.topk}"
             + (f" + {schedule.problem.extra_topk}" if schedule.problem.extra_topk else "")
             + ")" if schedule.problem.attention == "sparse" else "")
          + f", {schedule.problem.dtype}"
          + (f", KV cache {schedule.problem.kv}" if schedule.problem.kv != schedule.problem.dtype
             else ""), flush=True)
    t0 = time.perf_counter()
    run = runner(plan)                 # the build says what it does (mlagen.console)
    t_build = time.perf_counter() - t0
    print(f"kernel ready in {t_build:.2f} s", flush=True)
    with status("mlagen: drawing the workload ...", console.PROGRESS) as st:
        lens = _lengths(batch, seqlen, varlen, seed)
        if schedule.problem.attention == "sparse":
            # each query row names topk slots of its sequence (and of the second pool's)
            inp = make_sparse_inputs(schedule.problem, batch, lens, s_q=s_q,
                                     heads=schedule.heads_per_device, seed=seed,
                                     device=device)
        else:
            inp = make_inputs(schedule.problem, batch, lens, s_q=s_q,
                              heads=schedule.heads_per_device, seed=seed, device=device)
        st.update(f"mlagen: running the kernel ({device}) ...")
        t0 = time.perf_counter()
        out = run(inp, **run_kw)
        t_run = time.perf_counter() - t0
        st.update("mlagen: computing the float64 reference ...")
        t0 = time.perf_counter()
        # the verifier's oracle: float64 reference, rounded where the kernel stores bf16/fp16
        ref = oracle_for(plan)(inp, dtype=torch.float64)
        t_ref = time.perf_counter() - t0
    result = compare(out, ref, schedule.problem.dtype)
    print(f"ran in {t_run:.3f} s (reference in torch float64: {t_ref:.3f} s)")
    print(f"check against the reference: {result.summary()}")
    be.report(plan, out, chart)
    return 0 if result.ok else 1
