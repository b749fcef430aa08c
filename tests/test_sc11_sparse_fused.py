"""The fused operator over token-sparse pools on SC11 (schedules/sc11_sparse_fused.toml):
q_lora through the up-projections, sparse attention on the latent pools, W_UV.  The
reference composes exactly with the dense fused operator's; the emulator matches the
oracle under every scheme, with one pool and with two and sinks; bad inputs are refused in
one line before the kernel runs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mlagen import reference
from mlagen.backends import sc11
from mlagen.errors import InputError
from mlagen.paths import SCHEDULES_DIR
from mlagen.problem import SparseInputs, SparsePool, make_inputs, make_sparse_inputs, slots_of
from mlagen.schedule import load
from mlagen.verify.compare import compare
from mlagen.verify.oracle import oracle_for

SCHEMES = ("heads", "batch", "seq", "batch_seq")


def _schedule(two_pools: bool = False):
    s = load(SCHEDULES_DIR / "sc11_sparse_fused.toml")
    return s.replace(extra_topk=64, extra_page_size=16, sinks=True) if two_pools else s


def test_the_reference_is_the_dense_fused_operator_when_every_key_is_named():
    """Each query row naming exactly its causal window, in order: the same numbers, bit for
    bit, as the dense fused reference (the same absorbed query, positions and keys)."""
    p = load(SCHEDULES_DIR / "sc11_fused_tp4.toml").problem
    dense = make_inputs(p, 2, [37, 70], s_q=2, heads=8, seed=3)
    lens = dense.cache_seqlens.tolist()
    pos = torch.full((2, 2, max(lens)), -1, dtype=torch.int32)
    for b, n in enumerate(lens):
        for s in range(2):
            seen = n - 2 + s + 1
            pos[b, s, :seen] = torch.arange(seen, dtype=torch.int32)
    idx = slots_of(pos, dense.block_table, dense.page_size)
    sparse = SparseInputs(None, [SparsePool(dense.k_cache, idx)], dense.softmax_scale, dv=p.dv,
                          q_lora=dense.q_lora, weights=dense.weights,
                          cache_seqlens=dense.cache_seqlens)
    a, b = reference.run(dense, torch.float64), reference.run(sparse, torch.float64)
    assert torch.equal(a.out, b.out) and torch.equal(a.lse, b.lse)
    assert torch.isfinite(a.out).all()


@pytest.mark.parametrize("two_pools", [False, True], ids=["one pool", "two pools, sinks"])
def test_the_emulator_matches_the_oracle_under_every_scheme(two_pools):
    s = _schedule(two_pools)
    run = sc11.runner(s)
    inp = make_sparse_inputs(s.problem, 3, [5, 70, 300], s_q=2, heads=s.heads_per_device,
                             seed=2, invalid=0.1, repeats=0.1, topk_length=True,
                             windows=True)
    assert inp.q is None and inp.cache_seqlens.tolist() == [5, 70, 300]
    want = oracle_for(s)(inp, torch.float64)
    for scheme in SCHEMES:
        got = run(inp, scheme=scheme)
        assert got.out.shape == (3, 2, s.heads_per_device, s.problem.v_head_dim)
        cmp = compare(got, want, s.problem.dtype)
        assert cmp.ok, (scheme, cmp.summary())


@pytest.mark.parametrize("change,needle", [
    (lambda i: dataclasses.replace(i, cache_seqlens=torch.ones_like(i.cache_seqlens)),
     "cache_seqlens must be >= s_q = 2"),
    (lambda i: dataclasses.replace(i, cache_seqlens=None), "cache_seqlens"),
    (lambda i: dataclasses.replace(i, q=torch.zeros(2, 2, 16, 576, dtype=torch.bfloat16)),
     "needs q_lora"),
    (lambda i: dataclasses.replace(i, q_lora=i.q_lora[:, :, :100]), "q_lora has shape"),
])
def test_bad_fused_inputs_are_refused_in_one_line(change, needle):
    s = _schedule()
    inp = make_sparse_inputs(s.problem, 2, [10, 40], s_q=2, heads=s.heads_per_device, seed=1)
    with pytest.raises(InputError) as e:
        sc11.runner(s)(change(inp))
    msg = str(e.value)
    assert needle in msg and "\n" not in msg
