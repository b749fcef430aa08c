"""`mlagen run SCHEDULE --tp N`: the schedule's operator as a real tensor-parallel run.

N processes (torch.distributed: gloo on CPU, each rank one emulated SC11 card; nccl on GPUs),
rank r owning heads [r H / N, (r + 1) H / N) as in the seed (128 heads -> 32 a card at N = 4).
Every rank draws the same workload (one seed), keeps its heads' slice of q or of the
up-projection weights and runs its own operator; the outputs are all-gathered to rank 0,
which checks them against the reference of all heads and prints the TP step (SC11: each
card's simulated time and the o_proj all-reduce over the card link, see collective.py).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Optional

import torch

from .errors import MlagenError
from .schedule.records import Schedule
from .schedule.rules import check


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

    from . import runner
    from .parallel import head_range
    from .problem import make_inputs

    kind = schedule.target.name
    device = f"cuda:{rank}" if kind == "hopper" else "cpu"
    if kind == "sc11":
        torch.set_num_threads(1)
    p = schedule.problem
    full = make_inputs(p, len(lens), lens, s_q=s_q, heads=p.heads, seed=seed)
    lo, hi = head_range(p.heads, world, rank)
    mine = _slice(full, lo, hi).to(device)
    run = runner(schedule)
    out = run(mine, scheme=scheme) if kind == "sc11" else run(mine)
    kernel_s = 0.0
    if kind == "sc11":
        from .backends.sc11.costmodel import simulate
        from .backends.sc11.schemes import machine_for

        kernel_s = simulate(out.extra["trace"], machine_for(schedule)).total_s
    outs = [torch.empty_like(out.out) for _ in range(world)]
    lses = [torch.empty_like(out.lse) for _ in range(world)]
    dist.all_gather(outs, out.out.contiguous())
    dist.all_gather(lses, out.lse.contiguous())
    times = [None] * world
    dist.all_gather_object(times, kernel_s)
    if rank == 0:
        torch.save(dict(out=torch.cat([o.cpu() for o in outs], dim=2),
                        lse=torch.cat([x.cpu() for x in lses], dim=1), times=times,
                        scheme=out.extra.get("scheme")), result_path)


def run_tp(schedule: Schedule, tp: int, batch: Optional[int] = None,
           seqlen: Optional[int] = None, s_q: int = 1, seed: int = 0,
           scheme: Optional[str] = None, varlen: bool = False) -> int:
    from .parallel import spawn
    from .problem import MlaOutputs, make_inputs
    from .report import DEFAULTS, _lengths
    from .verify.compare import compare
    from .verify.oracle import oracle_for

    if tp < 1:
        raise MlagenError(f"--tp {tp} must be >= 1")
    s = schedule.replace(tp=tp)
    check(s)                       # tp must divide the heads, and the card's share must fit
    kind = s.target.name
    if s_q > s.problem.max_s_q:
        raise MlagenError(f"--s-q {s_q} is more than the schedule's max_s_q = "
                          f"{s.problem.max_s_q}")
    if kind == "hopper" and torch.cuda.device_count() < tp:
        raise MlagenError(f"--tp {tp} on target hopper needs {tp} GPUs; "
                          f"{torch.cuda.device_count()} found")
    b0, l0 = DEFAULTS[kind]
    batch, seqlen = batch or b0, seqlen or l0
    lens = _lengths(batch, seqlen, varlen, seed)
    print(f"schedule {s.name}: tp {tp} ranks, {s.heads_per_device} of {s.problem.heads} heads "
          f"each ({s.variant_name()}), batch {batch}, seqlen {seqlen}, s_q {s_q}; "
          f"{'gloo, emulated SC11 cards' if kind == 'sc11' else 'nccl, one GPU a rank'}")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tp.pt")
        spawn(_rank_main, tp, args=(s, lens, s_q, seed, scheme, path),
              device="cuda" if kind == "hopper" else "cpu")
        res = torch.load(path)
    full = make_inputs(s.problem, batch, lens, s_q=s_q, heads=s.problem.heads, seed=seed)
    ref = oracle_for(s)(full, dtype=torch.float64)
    result = compare(MlaOutputs(res["out"], res["lse"]), ref, s.problem.dtype)
    print(f"all {s.problem.heads} heads gathered from {tp} ranks vs the reference: "
          f"{result.summary()}")
    if kind == "sc11":
        from .backends.sc11.collective import tp_step

        print(f"phase-B scheme: {res['scheme']}")
        print(tp_step(res["times"], batch * s_q, check(s)).summary())
    return 0 if result.ok else 1
