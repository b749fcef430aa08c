"""mlagen.parallel: the process-group helpers behind `mlagen run --tp N` and the transformers
TP path, on gloo (CPU).  spawn's ranks must see their rank and world, sum over every rank,
and a rank that raises must fail the call in the parent (never hang, never pass)."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from mlagen.errors import InputError
from mlagen.parallel import all_reduce_sum, head_range, spawn, world


def _sum_ranks(rank: int, world_size: int, path: str) -> None:
    assert world() == (world_size, rank)
    x = torch.full((3,), float(rank + 1))
    all_reduce_sum(x)
    lo, hi = head_range(8, world_size, rank)
    torch.save(dict(sum=x, heads=(lo, hi)), f"{path}.{rank}")


def _rank1_raises(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("planted failure in rank 1")
    torch.distributed.barrier()      # rank 0 waits for a peer that never comes


@pytest.mark.parametrize("n", [2, 4])
def test_spawn_sums_over_every_rank(n, tmp_path):
    spawn(_sum_ranks, n, args=(str(tmp_path / "r"),))
    got = [torch.load(tmp_path / f"r.{r}") for r in range(n)]
    for g in got:
        assert torch.equal(g["sum"], torch.full((3,), float(n * (n + 1) // 2)))
    # each rank its own heads; together they tile [0, 8)
    assert [g["heads"] for g in got] == [(r * 8 // n, (r + 1) * 8 // n) for r in range(n)]


def test_a_failing_rank_fails_the_call():
    with pytest.raises(mp.ProcessRaisedException, match="planted failure in rank 1"):
        spawn(_rank1_raises, 2)


def test_outside_a_process_group():
    assert world() == (1, 0)
    x = torch.ones(2)
    assert all_reduce_sum(x) is x and torch.equal(x, torch.ones(2))
    assert head_range(128, 4, 3) == (96, 128)
    with pytest.raises(InputError, match="must divide"):
        head_range(128, 3, 0)
    with pytest.raises(InputError, match="not in"):
        head_range(128, 4, 4)
    with pytest.raises(InputError, match=">= 1"):
        spawn(_sum_ranks, 0)
