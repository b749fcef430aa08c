"""Tensor parallel over torch.distributed: one rank per card, heads split by rank.

    tp, rank = world()                    (1, 0) without an initialised process group
    lo, hi = head_range(heads, tp, rank)  the rank's heads, as in the seed (128 / 4 = 32 a card)
    all_reduce_sum(x)                     the o_proj partial sums of every rank (fp32)
    init_from_env()                       gloo on CPU, nccl on GPUs, from torchrun's variables

Each rank runs its own operator on its own heads; the only collective of an MLA layer is the
sum of the o_proj partial products (out[h] @ W_O[:, h's columns] summed over the cards).
"""

from __future__ import annotations

import faulthandler
import os
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from .envvars import EnvironmentVariableError, shown, whole_number
from .errors import InputError

__all__ = ["world", "head_range", "all_reduce_sum", "init_from_env", "backend_for", "spawn"]

_HOST = "127.0.0.1"


def world(group: Optional["dist.ProcessGroup"] = None) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def head_range(heads: int, tp: int, rank: int) -> tuple[int, int]:
    if tp < 1 or heads % tp:
        raise InputError(f"tp = {tp} must divide the {heads} heads")
    if not 0 <= rank < tp:
        raise InputError(f"rank {rank} is not in [0, {tp})")
    per = heads // tp
    return rank * per, (rank + 1) * per


def all_reduce_sum(x: torch.Tensor, group: Optional["dist.ProcessGroup"] = None) -> torch.Tensor:
    """Sum over the ranks in place (a no-op alone).  Reduced in fp32 so that tp = N gives the
    tp = 1 result up to the order of one fp32 sum."""
    if world(group)[0] > 1:
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
    return x


def backend_for(device: torch.device | str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_from_env(device: str = "cpu") -> tuple[int, int]:
    """Join the process group torchrun (or `mlagen run --tp N`) describes in the environment
    (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); on GPUs each rank takes cuda:LOCAL_RANK."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 1, 0
    world_size = whole_number("WORLD_SIZE", 1)
    rank = whole_number("RANK", 0)
    local = whole_number("LOCAL_RANK", 0)
    if rank is None or world_size is None or rank >= world_size:
        raise EnvironmentVariableError("RANK", f"{shown(os.environ['RANK'])} must be below "
                                               f"WORLD_SIZE = {os.environ['WORLD_SIZE']!r}")
    if not dist.is_initialized():
        if device == "cuda":
            torch.cuda.set_device(rank if local is None else local)
        dist.init_process_group(backend_for(device))
    return world()


def _entry(rank: int, fn: Callable, world_size: int, port: int, device: str,
           args: tuple) -> None:
    # A native abort in a rank (gloo, the emulator) prints every thread's Python stack.
    faulthandler.enable(all_threads=True)
    os.environ.update(MASTER_ADDR=_HOST, MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    if device == "cuda":
        torch.cuda.set_device(rank)
    # The parent hosts the store, so it outlives every rank (no rank serves the others).
    store = dist.TCPStore(_HOST, port, is_master=False)
    dist.init_process_group(backend_for(device), store=store, rank=rank, world_size=world_size)
    fn(rank, world_size, *args)
    # No rank closes its connections while a peer's last collective is still in flight.
    dist.barrier()
    dist.destroy_process_group()


def spawn(fn: Callable, nprocs: int, args: tuple = (), device: str = "cpu") -> None:
    """Run fn(rank, world_size, *args) in nprocs fresh processes joined in one process group
    (gloo on CPU, each rank one emulated card; nccl on GPUs, rank r on cuda:r), as torchrun
    would; fn must be importable (a module-level function).  Raises if any rank fails."""
    import torch.multiprocessing as mp

    if nprocs < 1:
        raise InputError(f"tp = {nprocs} must be >= 1")
    if device == "cuda" and torch.cuda.device_count() < nprocs:
        raise InputError(f"tp = {nprocs} needs {nprocs} GPUs; {torch.cuda.device_count()} found")
    store = dist.TCPStore(_HOST, 0, world_size=nprocs, is_master=True, wait_for_workers=False)
    mp.start_processes(_entry, args=(fn, nprocs, store.port, device, args), nprocs=nprocs,
                       join=True, start_method="spawn")
