"""The token-sparse reference (mlagen.reference.sparse_attention, FlashMLA's sparse decode
convention) against dense attention, a row-by-row oracle, and its edge cases."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlagen import kvformat
from mlagen.errors import InputError
from mlagen.problem import SparsePool, make_paged_cache, slots_of, sparse_pool
from mlagen.reference import attention, sparse_attention

F64 = torch.float64


def _all_positions(lens, s_q, causal):
    """Every position each query row may see, as a sparse index list (-1 padded)."""
    topk = max(max(lens), 1)
    pos = torch.full((len(lens), s_q, topk), -1, dtype=torch.int64)
    for i, n in enumerate(lens):
        for j in range(s_q):
            lim = n - s_q + j + 1 if causal else n
            if lim > 0:
                pos[i, j, :lim] = torch.arange(lim)
    return pos


@pytest.mark.parametrize("causal", [False, True])
def test_all_positions_equal_dense_attention(causal):
    g = torch.Generator().manual_seed(0)
    lens = [0, 1, 64, 65, 200]
    cache, table = make_paged_cache(lens, 64, 576, torch.bfloat16, g)
    q = torch.randn(5, 3, 8, 576, generator=g).to(torch.bfloat16)
    pool = SparsePool(cache, slots_of(_all_positions(lens, 3, causal), table, 64))
    o, lse = sparse_attention(q, [pool], dtype=F64)
    want_o, want_lse = attention(q, cache, table, torch.tensor(lens, dtype=torch.int32),
                                 causal=causal, dtype=F64)
    torch.testing.assert_close(o, want_o, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-12)


def _oracle(q, pools, dv, scale, sink):
    """Row by row, key by key: the softmax over the keys the row's entries name."""
    b, s_q, h, d = q.shape
    out = torch.zeros(b, s_q, h, dv, dtype=F64)
    lse = torch.full((b, h, s_q), math.inf, dtype=F64)
    flat = []
    for p in pools:
        vals = kvformat.dequantize(p.k_cache, p.kv_format or kvformat.detect(p.k_cache, d - 64),
                                   None, d - 64, F64)
        if p.k_descale is not None:
            vals = vals * float(p.k_descale[0])
        flat.append(vals.reshape(-1, d))
    for i in range(b):
        for j in range(s_q):
            keys = []
            for p, f in zip(pools, flat):
                n = p.indices.shape[-1] if p.topk_length is None else int(p.topk_length[i])
                keys += [f[int(e)] for e in p.indices[i, j, :n] if int(e) >= 0]
            if not keys:
                continue
            k = torch.stack(keys)
            for hh in range(h):
                sc = (k @ q[i, j, hh].double()) * scale
                m = sc.max()
                w = torch.exp(sc - m)
                l = float(m + torch.log(w.sum()))
                o = (w / w.sum()) @ k[:, :dv]
                if sink is not None:
                    o = o / (1 + math.exp(min(float(sink[hh]) - l, 700.0))) \
                        if float(sink[hh]) != math.inf else o * 0
                out[i, j, hh] = o
                lse[i, hh, j] = l
    return out, lse


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_matches_a_row_by_row_oracle(data):
    seed = data.draw(st.integers(0, 2 ** 16), label="seed")
    g = torch.Generator().manual_seed(seed)
    b = data.draw(st.integers(1, 3), label="b")
    s_q = data.draw(st.integers(1, 3), label="s_q")
    lens = data.draw(st.lists(st.integers(0, 150), min_size=b, max_size=b), label="lens")
    h = data.draw(st.sampled_from([1, 3, 8]), label="h")
    n_pools = data.draw(st.integers(1, 2), label="pools")
    pools = []
    for k in range(n_pools):
        fmt = data.draw(st.sampled_from(["bf16", "fp8_e4m3", "fp8_ds_mla"]), label=f"fmt{k}")
        page = data.draw(st.sampled_from([1, 2, 16, 64]), label=f"page{k}")
        topk = data.draw(st.integers(1, 96), label=f"topk{k}")
        pools.append(sparse_pool(lens, s_q, topk, page, 576, torch.bfloat16, g, kv_format=fmt,
                                 invalid=data.draw(st.sampled_from([0.0, 0.3, 1.0])),
                                 repeats=data.draw(st.sampled_from([0.0, 0.3])),
                                 topk_length=data.draw(st.booleans())))
    sink = data.draw(st.sampled_from(["none", "finite", "inf"]), label="sink")
    attn_sink = None
    if sink != "none":
        attn_sink = torch.randn(h, generator=g) * 3
        if sink == "inf":
            attn_sink[0], attn_sink[-1] = math.inf, -math.inf
    q = torch.randn(b, s_q, h, 576, generator=g).to(torch.bfloat16)
    scale = 576 ** -0.55
    o, lse = sparse_attention(q, pools, softmax_scale=scale, attn_sink=attn_sink, dtype=F64)
    want_o, want_lse = _oracle(q, pools, 512, scale, attn_sink)
    torch.testing.assert_close(lse, want_lse, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(o, want_o, rtol=1e-9, atol=1e-9)
    assert not bool(torch.isnan(o).any())                 # NaN slots are never named


def test_sink_scales_output_not_lse():
    g = torch.Generator().manual_seed(1)
    pool = sparse_pool([100, 0], 1, 32, 16, 576, torch.bfloat16, g)
    q = torch.randn(2, 1, 4, 576, generator=g).to(torch.bfloat16)
    base_o, base_lse = sparse_attention(q, [pool], dtype=F64)
    sink = torch.tensor([0.5, math.inf, -math.inf, 2.0])
    o, lse = sparse_attention(q, [pool], attn_sink=sink, dtype=F64)
    torch.testing.assert_close(lse, base_lse)
    factor = torch.sigmoid(base_lse[0, :, 0] - sink.double())
    torch.testing.assert_close(o[0, 0], base_o[0, 0] * factor[:, None])
    assert bool((o[0, 0, 1] == 0).all()) and torch.equal(o[0, 0, 2], base_o[0, 0, 2])
    assert bool((o[1] == 0).all()) and bool(torch.isinf(lse[1]).all())   # no keys


def test_repeated_entry_counts_twice():
    g = torch.Generator().manual_seed(2)
    cache, table = make_paged_cache([10], 16, 576, torch.bfloat16, g)
    q = torch.randn(1, 1, 2, 576, generator=g).to(torch.bfloat16)
    s = slots_of(torch.tensor([[[3, 7, 3]]]), table, 16)
    twice = sparse_attention(q, [SparsePool(cache, s)], dtype=F64)
    split = sparse_attention(q, [SparsePool(cache, s[..., :2]), SparsePool(cache, s[..., 2:])],
                             dtype=F64)
    torch.testing.assert_close(twice[0], split[0])
    once = sparse_attention(q, [SparsePool(cache, s[..., :2])], dtype=F64)
    assert float((twice[1] - once[1]).abs().max()) > 1e-6   # the repeat changes the weights


def test_topk_length_keeps_the_leftmost_entries():
    g = torch.Generator().manual_seed(3)
    pool = sparse_pool([80, 80], 2, 40, 64, 576, torch.bfloat16, g)
    q = torch.randn(2, 2, 4, 576, generator=g).to(torch.bfloat16)
    cut = SparsePool(pool.k_cache, pool.indices, torch.tensor([7, 0], dtype=torch.int32))
    o, lse = sparse_attention(q, [cut], dtype=F64)
    left = SparsePool(pool.k_cache, pool.indices[:, :, :7].contiguous())
    o7, lse7 = sparse_attention(q[:1], [SparsePool(left.k_cache, left.indices[:1])], dtype=F64)
    torch.testing.assert_close(o[:1], o7)
    assert bool((o[1] == 0).all()) and bool(torch.isinf(lse[1]).all())


def test_nan_in_a_named_slot_propagates():
    g = torch.Generator().manual_seed(4)
    cache, table = make_paged_cache([20], 16, 576, torch.bfloat16, g)
    s = slots_of(torch.tensor([[[1, 2]]]), table, 16)
    q = torch.randn(1, 1, 2, 576, generator=g).to(torch.bfloat16)
    clean = sparse_attention(q, [SparsePool(cache, s)], dtype=F64)[0]
    assert not bool(torch.isnan(clean).any())
    cache[int(table[0, 0]), 2, 0, 5] = math.nan
    assert bool(torch.isnan(sparse_attention(q, [SparsePool(cache, s)], dtype=F64)[0]).all())


def test_bad_sparse_inputs():
    cache = torch.zeros(2, 16, 1, 576, dtype=torch.bfloat16)
    q = torch.zeros(1, 1, 2, 576, dtype=torch.bfloat16)
    idx = torch.tensor([[[0, 31]]], dtype=torch.int32)
    with pytest.raises(InputError, match="name slot 32"):
        sparse_attention(q, [SparsePool(cache, idx + 1)])
    with pytest.raises(InputError, match="indices must be int32"):
        sparse_attention(q, [SparsePool(cache, idx.long())])
    with pytest.raises(InputError, match="topk_length must be >= 0"):
        sparse_attention(q, [SparsePool(cache, idx, torch.tensor([-1], dtype=torch.int32))])
    with pytest.raises(InputError, match="attn_sink must be fp32"):
        sparse_attention(q, [SparsePool(cache, idx)], attn_sink=torch.zeros(3))
    with pytest.raises(InputError, match="at least one pool"):
        sparse_attention(q, [])


def test_sparse_problem_workload_runs_through_the_reference():
    from mlagen.problem import make_sparse_inputs
    from mlagen.reference import run
    from mlagen.schedule.records import Problem

    p = Problem(heads=16, kv_lora_rank=448, v_dim=512, page_size=64, attention="sparse",
                topk=128, extra_topk=64, extra_page_size=2, kv_format="fp8_ue8m0_paged",
                extra_kv_format="bf16", sinks=True, causal=False)
    inp = make_sparse_inputs(p, 2, [300, 0], s_q=2, extra_seqlens=[75, 3], invalid=0.1,
                             topk_length=True, infinite_sinks=True, seed=7)
    assert [pool.kv_format for pool in inp.pools] == ["fp8_ue8m0_paged", "bf16"]
    assert inp.pools[1].k_cache.shape[1] == 2 and inp.q.shape == (2, 2, 16, 512)
    got = run(inp, F64)
    want = sparse_attention(inp.q, inp.pools, dv=512, softmax_scale=inp.softmax_scale,
                            attn_sink=inp.attn_sink, dtype=F64)
    torch.testing.assert_close(got.out, want[0])
    assert got.out.shape == (2, 2, 16, 512)
    assert bool((got.out[:, :, 0] == 0).all())            # the +inf sink
    oracle = _oracle(inp.q, inp.pools, 512, inp.softmax_scale, inp.attn_sink)
    torch.testing.assert_close(got.out, oracle[0], rtol=1e-9, atol=1e-9)
