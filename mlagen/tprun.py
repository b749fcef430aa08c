"""`mlagen run SCHEDULE --tp N`: the schedule's operator as a real tensor-parallel run.

N processes (torch.distributed: gloo on the CPU, each rank one emulated card; nccl on GPUs,
one GPU a rank), rank r owning heads [r H / N, (r + 1) H / N) as in the seed (128 heads ->
32 a card at N = 4).  Every rank draws the same workload (one seed), keeps its heads' slice
of q or of the up-projection weights and runs its own operator; the outputs are all-gathered
to rank 0 and checked against the reference of all heads; the backend then reports the step
(for the emulated card: each card's simulated time and the o_proj all-reduce over the link).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from typing import Optional

import torch

from .errors import MlagenError
from .schedule.records import Schedule
from .schedule.rules import plan_of


def _slice(inp, lo: int, hi: int):
    if inp.q is not None:
        return dataclasses.replace(inp, q=inp.q[:, :, lo:hi].contiguous())
    w = inp.weights
    return dataclasses.replace(inp, weights=dataclasses.replace(
        w, w_uq=w.w_uq[:, lo:hi].contiguous(), w_uk=w.w_uk[lo:hi].contiguous(),
        w_uv=w.w_uv[lo:hi].contiguous()))


def _rank_main(rank: int, world: int, schedule: Schedule, lens: list, s_q: int, seed: int,
               scheme: Optional[str], result_path: str) -> None:
    import torch.distributed as dist

    from .parallel import head_range
    from .problem import make_inputs

    plan = plan_of(schedule)
    be = plan.backend
    device = f"cuda:{rank}" if be.device == "cuda" else be.device
    if be.device == "cpu":
        torch.set_num_threads(1)      # the ranks share the host's cores
    p = schedule.problem
    full = make_inputs(p, len(lens), lens, s_q=s_q, heads=p.heads, seed=seed)
    lo, hi = head_range(p.heads, world, rank)
    out = be.runner(plan)(_slice(full, lo, hi).to(device), **be.run_kwargs(scheme))
    outs = [torch.empty_like(out.out) for _ in range(world)]
    lses = [torch.empty_like(out.lse) for _ in range(world)]
    dist.all_gather(outs, out.out.contiguous())
    dist.all_gather(lses, out.lse.contiguous())
    infos = [None] * world
    dist.all_gather_object(infos, be.tp_rank_info(plan, out))
    if rank == 0:
        torch.save(dict(out=torch.cat([o.cpu() for o in outs], dim=2),
                        lse=torch.cat([x.cpu() for x in lses], dim=1), infos=infos),
                   result_path)


def cpu_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def run_tp(schedule: Schedule, tp: int, batch: Optional[int] = None,
           seqlen: Optional[int] = None, s_q: int = 1, seed: int = 0,
           scheme: Optional[str] = None, varlen: bool = False) -> int:
    from .parallel import backend_for, spawn
    from .problem import MlaOutputs, make_inputs
    from .report import _lengths
    from .verify.compare import compare
    from .verify.oracle import oracle_for

    if tp < 1:
        raise MlagenError(f"--tp {tp} must be >= 1")
    s = schedule.replace(tp=tp)
    plan = plan_of(s)              # tp must divide the heads, and the card's share must fit
    be = plan.backend
    if s_q > s.problem.max_s_q:
        raise MlagenError(f"--s-q {s_q} is more than the schedule's max_s_q = "
                          f"{s.problem.max_s_q}")
    why = be.device_check()
    if why:
        raise MlagenError(why)
    if be.device == "cuda" and torch.cuda.device_count() < tp:
        raise MlagenError(f"--tp {tp} needs {tp} GPUs; {torch.cuda.device_count()} found")
    if be.device == "cpu" and tp > cpu_cores():
        # allowed (the result is the same), but say once why it will be slow
        print(f"mlagen: warning: --tp {tp} starts {tp} processes on {cpu_cores()} CPU "
              "cores; the ranks take turns, so the run is slower than on a machine with "
              "a core each", file=sys.stderr, flush=True)
    b0, l0 = be.run_point
    batch, seqlen = batch or b0, seqlen or l0
    lens = _lengths(batch, seqlen, varlen, seed)
    print(f"schedule {s.name}: tp {tp} ranks, {s.heads_per_device} of {s.problem.heads} heads "
          f"each ({s.variant_name()}), batch {batch}, seqlen {seqlen}, s_q {s_q}; "
          f"{backend_for(be.device)}, one {'GPU' if be.device == 'cuda' else 'process'} a rank")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tp.pt")
        spawn(_rank_main, tp, args=(s, lens, s_q, seed, scheme, path), device=be.device)
        res = torch.load(path)
    full = make_inputs(s.problem, batch, lens, s_q=s_q, heads=s.problem.heads, seed=seed)
    ref = oracle_for(plan)(full, dtype=torch.float64)
    result = compare(MlaOutputs(res["out"], res["lse"]), ref, s.problem.dtype)
    print(f"all {s.problem.heads} heads gathered from {tp} ranks vs the reference: "
          f"{result.summary()}")
    be.tp_report(plan, res["infos"], batch * s_q)
    return 0 if result.ok else 1
