"""The torch references: each convention of docs/conventions.md checked on its own, against
slow per-row code that reads the cache token by token (no masks, no block gathers)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlagen import reference as R
from mlagen.errors import InputError
from mlagen.problem import FusedWeights, MlaInputs, make_inputs, make_paged_cache
from mlagen.schedule.records import Problem

F64 = torch.float64
HYP = settings(max_examples=40, deadline=None,
               suppress_health_check=[HealthCheck.too_slow])


# ---- slow, obviously-right helpers --------------------------------------------------

def token(cache, table, i, t):
    """Slot t of sequence i, read one token at a time through the block table."""
    page = cache.shape[1]
    return cache[int(table[i, t // page]), t % page]              # [h_kv, d]


def seen(length: int, s_q: int, row: int, causal: bool) -> int:
    """How many keys query row `row` sees (counted, not masked)."""
    if not causal:
        return length
    return min(length, max(0, length - (s_q - 1 - row)))


def naive_attention(q, cache, table, lens, dv, scale, causal):
    b, s_q, h, d = q.shape
    out = torch.zeros(b, s_q, h, dv, dtype=F64)
    lse = torch.full((b, h, s_q), math.inf, dtype=F64)
    for i in range(b):
        n_all = int(lens[i])
        keys = [token(cache, table, i, t)[0].double() for t in range(n_all)]
        for r in range(s_q):
            n = seen(n_all, s_q, r, causal)
            if n == 0:
                continue
            k = torch.stack(keys[:n])                               # [n, d]
            s = q[i, r].double() @ k.T * scale                      # [h, n]
            lse[i, :, r] = torch.logsumexp(s, -1)
            out[i, r] = torch.softmax(s, -1) @ k[:, :dv]
    return out, lse


def small_inputs(lens, s_q=1, h=2, dv=32, rope=16, page=16, seed=0, shuffle=True,
                 causal=True):
    g = torch.Generator().manual_seed(seed)
    cache, table = make_paged_cache(lens, page, dv + rope, F64, g, shuffle=shuffle)
    q = torch.randn(len(lens), s_q, h, dv + rope, generator=g, dtype=F64)
    seq = torch.tensor(lens, dtype=torch.int32)
    return MlaInputs(q, cache, table, seq, (dv + rope) ** -0.5, causal, dv=dv)


def call(inp: MlaInputs, dtype=F64, **kw):
    args = dict(dv=inp.dv, softmax_scale=inp.softmax_scale, causal=inp.causal, dtype=dtype)
    args.update(kw)
    return R.attention(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, **args)


def assert_same(a, b, atol=1e-12):
    """Equal within atol, with inf and NaN in the same places."""
    assert a.shape == b.shape
    assert torch.equal(torch.isinf(a), torch.isinf(b))
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    fa, fb = a[torch.isfinite(a)], b[torch.isfinite(b)]
    assert torch.allclose(fa, fb, atol=atol, rtol=0), (fa - fb).abs().max()


# ---- attention conventions ----------------------------------------------------------

def test_causal_bottom_right_against_counted_rows():
    # s_q = 4 on lengths around s_q and page boundaries
    inp = small_inputs([1, 3, 4, 5, 16, 17, 40], s_q=4, h=3)
    out, lse = call(inp)
    ref_out, ref_lse = naive_attention(inp.q, inp.k_cache, inp.block_table,
                                       inp.cache_seqlens, inp.dv, inp.softmax_scale, True)
    assert_same(out, ref_out)
    assert_same(lse, ref_lse)


def test_causal_rows_differ_and_last_row_sees_everything():
    # the last query row sees every key, so it equals a non-causal single-row query
    inp = small_inputs([9, 33], s_q=3)
    out, lse = call(inp)
    last = MlaInputs(inp.q[:, -1:].clone(), inp.k_cache, inp.block_table, inp.cache_seqlens,
                     inp.softmax_scale, False, dv=inp.dv)
    o1, l1 = call(last)
    assert_same(out[:, -1:], o1)
    assert_same(lse[:, :, -1:], l1)
    # and an earlier row does not (it sees one key fewer)
    assert not torch.allclose(out[:, 0], out[:, -1])
    # row 0 of s_q = 3 over 9 keys equals a single query over the first 7 keys
    first = MlaInputs(inp.q[:1, :1].clone(), inp.k_cache, inp.block_table[:1],
                      torch.tensor([7], dtype=torch.int32), inp.softmax_scale, True, dv=inp.dv)
    o7, l7 = call(first)
    assert_same(out[:1, :1], o7)
    assert_same(lse[:1, :, :1], l7)


def test_non_causal_every_row_sees_all_keys():
    inp = small_inputs([2, 20], s_q=3, causal=False)
    out, lse = call(inp)
    ref = naive_attention(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, inp.dv,
                          inp.softmax_scale, False)
    assert_same(out, ref[0])
    assert_same(lse, ref[1])
    assert torch.isfinite(lse).all()


def test_lse_is_natural_log_of_scaled_scores():
    inp = small_inputs([37], s_q=1, h=2)
    scale = 0.37
    _, lse = call(inp, softmax_scale=scale)
    keys = torch.stack([token(inp.k_cache, inp.block_table, 0, t)[0] for t in range(37)])
    scores = inp.q[0, 0] @ keys.T * scale                          # [h, 37]
    expect = torch.log(torch.exp(scores).sum(-1))
    assert torch.allclose(lse[0, :, 0], expect, atol=1e-12, rtol=0)


def test_default_scale_is_d_to_minus_half():
    inp = small_inputs([21], h=2)
    d = inp.q.shape[-1]
    a = call(inp, softmax_scale=None)
    b = call(inp, softmax_scale=d ** -0.5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    c = call(inp, softmax_scale=1.0)
    assert not torch.allclose(a[1], c[1])


def test_empty_sequence_gives_zero_and_plus_inf():
    inp = small_inputs([0, 5, 0], s_q=2)
    out, lse = call(inp)
    for i in (0, 2):
        assert torch.equal(out[i], torch.zeros_like(out[i]))
        assert torch.isposinf(lse[i]).all()
    assert torch.isfinite(out[1]).all()
    assert torch.isfinite(lse[1]).all()


def test_rows_beyond_a_short_sequence_see_nothing():
    # s_q = 4 over 2 keys: rows 0 and 1 see nothing, rows 2 and 3 see 1 and 2 keys
    inp = small_inputs([2], s_q=4)
    out, lse = call(inp)
    assert torch.equal(out[0, :2], torch.zeros_like(out[0, :2]))
    assert torch.isposinf(lse[0, :, :2]).all()
    assert torch.isfinite(lse[0, :, 2:]).all()
    k0 = token(inp.k_cache, inp.block_table, 0, 0)[0]
    # one visible key: softmax is 1, the output is that key's V, lse its scaled score
    assert torch.allclose(out[0, 2], k0[:inp.dv].expand(out.shape[2], -1), atol=1e-12)
    assert torch.allclose(lse[0, :, 2], inp.q[0, 2] @ k0 * inp.softmax_scale, atol=1e-12)


def test_every_unread_slot_poisoned_changes_nothing():
    inp = small_inputs([1, 16, 17, 45], s_q=2, page=16, seed=3)
    base = call(inp)
    # poison every slot outside [0, len) of every sequence, and point unused table entries
    # far out of range: nothing of it may be read
    page = inp.k_cache.shape[1]
    read = torch.zeros(inp.k_cache.shape[:2], dtype=torch.bool)
    for i, n in enumerate(inp.cache_seqlens.tolist()):
        for t in range(n):
            read[int(inp.block_table[i, t // page]), t % page] = True
    cache = inp.k_cache.clone()
    cache[~read] = float("nan")
    table = inp.block_table.clone()
    for i, n in enumerate(inp.cache_seqlens.tolist()):
        table[i, -(-n // page):] = 10 ** 6
    poisoned = MlaInputs(inp.q, cache, table, inp.cache_seqlens, inp.softmax_scale, True,
                         dv=inp.dv)
    out, lse = call(poisoned)
    assert torch.equal(out, base[0]) and torch.equal(lse, base[1])
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()


def test_last_slot_of_a_partial_page_is_read():
    # guards against reading too little (a skipped partial page)
    inp = small_inputs([17], page=16)
    out, _ = call(inp)
    cache = inp.k_cache.clone()
    cache[int(inp.block_table[0, 1]), 0] *= 3.0
    out2, _ = call(MlaInputs(inp.q, cache, inp.block_table, inp.cache_seqlens,
                             inp.softmax_scale, True, dv=inp.dv))
    assert not torch.allclose(out, out2)


def test_make_inputs_nan_never_reaches_outputs():
    for fused in (False, True):
        p = Problem(heads=8, fused=fused, page_size=64)
        inp = make_inputs(p, 4, [0, 1, 64, 130], s_q=2, seed=5)
        res = R.run(inp)
        assert not torch.isnan(res.out).any() and not torch.isnan(res.lse).any()


def test_float32_close_to_float64():
    p = Problem(heads=16)
    inp = make_inputs(p, 3, [1, 100, 700], s_q=2, seed=7)
    a, b = R.run(inp, torch.float32), R.run(inp, F64)
    assert a.out.dtype == torch.float32 and a.lse.dtype == torch.float32
    assert b.out.dtype == F64 and b.lse.dtype == F64
    assert torch.allclose(a.out.double(), b.out, atol=2e-5, rtol=0)
    fin = torch.isfinite(b.lse)
    assert torch.allclose(a.lse.double()[fin], b.lse[fin], atol=2e-5, rtol=0)


def test_shuffled_table_same_as_in_order():
    lens = [5, 64, 65, 200]
    inp = small_inputs(lens, s_q=2, page=16, shuffle=False, seed=11)
    assert torch.equal(inp.block_table[0, :1], torch.tensor([0], dtype=torch.int32))
    base = call(inp)
    perm = torch.randperm(inp.k_cache.shape[0], generator=torch.Generator().manual_seed(1))
    cache = torch.empty_like(inp.k_cache)
    cache[perm] = inp.k_cache                                      # page j moves to perm[j]
    table = perm[inp.block_table.long()].to(torch.int32)
    assert not torch.equal(table, inp.block_table)
    out, lse = call(MlaInputs(inp.q, cache, table, inp.cache_seqlens, inp.softmax_scale,
                              True, dv=inp.dv))
    assert_same(out, base[0], atol=0)
    assert_same(lse, base[1], atol=0)


def test_noncontiguous_q_same_as_contiguous():
    p = Problem(heads=4)
    inp = make_inputs(p, 2, [10, 70], s_q=2, seed=1, q_noncontiguous=True)
    assert not inp.q.is_contiguous()
    a = call(inp, dtype=torch.float32)
    b = call(MlaInputs(inp.q.contiguous(), inp.k_cache, inp.block_table, inp.cache_seqlens,
                       inp.softmax_scale, True, dv=inp.dv), dtype=torch.float32)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_several_kv_heads_map_query_heads_in_groups():
    g = torch.Generator().manual_seed(2)
    lens = [9, 30]
    cache, table = make_paged_cache(lens, 8, 24, F64, g)
    cache2 = torch.stack((cache[:, :, 0], cache[:, :, 0].flip(-1)), dim=2)   # h_kv = 2
    q = torch.randn(2, 2, 6, 24, generator=g, dtype=F64)          # h_q = 6: groups of 3
    seq = torch.tensor(lens, dtype=torch.int32)
    out, lse = R.attention(q, cache2, table, seq, dv=16, dtype=F64)
    for kv in range(2):
        o, l_ = R.attention(q[:, :, 3 * kv:3 * kv + 3].contiguous(), cache2[:, :, kv:kv + 1],
                            table, seq, dv=16, dtype=F64)
        assert_same(out[:, :, 3 * kv:3 * kv + 3], o)
        assert_same(lse[:, 3 * kv:3 * kv + 3], l_)


def test_batch_chunks_give_the_same_result(monkeypatch):
    inp = small_inputs([3, 50, 0, 17, 90], s_q=2, seed=4)
    whole = call(inp)
    monkeypatch.setattr(R, "_CHUNK_ELEMENTS", 1)                 # one sequence per chunk
    parts = call(inp)
    # equal up to rounding: a chunk pads to its own longest sequence, not the batch's
    assert_same(whole[0], parts[0], atol=1e-13)
    assert_same(whole[1], parts[1], atol=1e-13)


@HYP
@given(lens=st.lists(st.integers(0, 70), min_size=1, max_size=3), s_q=st.integers(1, 4),
       h=st.integers(1, 4), page=st.sampled_from([1, 3, 16, 64]), causal=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_attention_matches_token_by_token(lens, s_q, h, page, causal, seed):
    inp = small_inputs(lens, s_q=s_q, h=h, dv=16, rope=8, page=page, seed=seed,
                       causal=causal)
    out, lse = call(inp)
    ref = naive_attention(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, inp.dv,
                          inp.softmax_scale, causal)
    assert_same(out, ref[0])
    assert_same(lse, ref[1])


@pytest.mark.parametrize("bad", ["table_dtype", "seqlen_dtype", "too_long", "page_range",
                                 "heads", "dv", "dtype", "batch", "negative"])
def test_bad_inputs_raise_input_error(bad):
    inp = small_inputs([5, 20], page=16)
    q, cache, table, seq = inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens
    kw = dict(dv=inp.dv, dtype=F64)
    if bad == "table_dtype":
        table = table.long()
    elif bad == "seqlen_dtype":
        seq = seq.long()
    elif bad == "too_long":
        seq = torch.tensor([5, table.shape[1] * 16 + 1], dtype=torch.int32)
    elif bad == "page_range":
        table = table.clone()
        table[1, 0] = cache.shape[0]
    elif bad == "heads":
        cache = cache.expand(-1, -1, 3, -1)                        # h_q = 2 is not a multiple
    elif bad == "dv":
        kw["dv"] = q.shape[-1] + 1
    elif bad == "dtype":
        kw["dtype"] = torch.bfloat16
    elif bad == "batch":
        q = q[:1]
    elif bad == "negative":
        seq = torch.tensor([5, -1], dtype=torch.int32)
    with pytest.raises(InputError):
        R.attention(q, cache, table, seq, **kw)


# ---- RoPE ---------------------------------------------------------------------------

def test_rope_interleaved_pairs_and_frequencies():
    x = torch.randn(3, 8, dtype=F64)
    pos = torch.tensor([0, 1, 5])
    y = R.rope(x, pos, theta=100.0)
    assert torch.allclose(y[0], x[0], atol=1e-15)                  # position 0: identity
    for row, p in ((1, 1), (2, 5)):
        for i in range(4):
            a = p * 100.0 ** (-2 * i / 8)
            c, s = math.cos(a), math.sin(a)
            x0, x1 = x[row, 2 * i].item(), x[row, 2 * i + 1].item()
            assert y[row, 2 * i].item() == pytest.approx(x0 * c - x1 * s, abs=1e-13)
            assert y[row, 2 * i + 1].item() == pytest.approx(x0 * s + x1 * c, abs=1e-13)


def test_rope_dot_product_depends_on_offset_only():
    q, k = torch.randn(16, dtype=F64), torch.randn(16, dtype=F64)
    d1 = R.rope(q, torch.tensor(107)) @ R.rope(k, torch.tensor(100))
    d2 = R.rope(q, torch.tensor(12007)) @ R.rope(k, torch.tensor(12000))
    assert d1.item() == pytest.approx(d2.item(), abs=1e-9)


def test_rope_large_positions_exact_in_float32():
    # angles are formed in float64: float32 rope at 100000 agrees with float64 rope
    x = torch.randn(4, 64, dtype=F64)
    pos = torch.tensor([99_999, 100_000, 131_071, 7])
    a = R.rope(x.float(), pos).double()
    b = R.rope(x, pos)
    assert torch.allclose(a, b, atol=1e-5)


# ---- fused operator -----------------------------------------------------------------

def fused_case(lens, s_q, h, rank, nope, rope, r_q, v, page, seed, causal=True):
    g = torch.Generator().manual_seed(seed)
    cache, table = make_paged_cache(lens, page, rank + rope, F64, g)
    w = FusedWeights(w_uq=torch.randn(r_q, h, nope + rope, generator=g, dtype=F64) * r_q ** -.5,
                     w_uk=torch.randn(h, nope, rank, generator=g, dtype=F64) * nope ** -.5,
                     w_uv=torch.randn(h, rank, v, generator=g, dtype=F64) * rank ** -.5,
                     rope_theta=float(torch.randint(100, 20000, (1,), generator=g)))
    q_lora = torch.randn(len(lens), s_q, r_q, generator=g, dtype=F64)
    seq = torch.tensor(lens, dtype=torch.int32)
    return MlaInputs(None, cache, table, seq, (nope + rope) ** -0.5, causal, q_lora=q_lora,
                     weights=w, dv=rank)


def fused_args(inp, rope):
    return (inp.q_lora, inp.weights, inp.k_cache, inp.block_table, inp.cache_seqlens,
            inp.softmax_scale, inp.causal, rope, F64)


@HYP
@given(lens=st.lists(st.integers(0, 40), min_size=1, max_size=4), s_q=st.integers(1, 3),
       h=st.integers(1, 8), rank=st.sampled_from([16, 64]), nope=st.sampled_from([8, 16]),
       rope=st.sampled_from([4, 16]), r_q=st.sampled_from([8, 32]), v=st.sampled_from([8, 16]),
       page=st.sampled_from([1, 4, 16]), causal=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_absorbed_equals_plain(lens, s_q, h, rank, nope, rope, r_q, v, page, causal, seed):
    inp = fused_case(lens, s_q, h, rank, nope, rope, r_q, v, page, seed, causal)
    a_out, a_lse = R.fused_absorbed(*fused_args(inp, rope))
    p_out, p_lse = R.fused_plain(*fused_args(inp, rope))
    assert a_out.shape == (len(lens), s_q, h, v) and a_lse.shape == (len(lens), h, s_q)
    assert_same(a_out, p_out, atol=1e-11)
    assert_same(a_lse, p_lse, atol=1e-11)


def test_fused_plain_against_token_by_token():
    lens, s_q, h, rank, nope, rope = [0, 3, 21], 2, 3, 16, 8, 8
    inp = fused_case(lens, s_q, h, rank, nope, rope, 12, 8, 4, seed=9)
    out, lse = R.fused_plain(*fused_args(inp, rope))
    w = inp.weights
    for i, n in enumerate(lens):
        for r in range(s_q):
            m = seen(n, s_q, r, True)
            for hh in range(h):
                if m == 0:
                    assert torch.isposinf(lse[i, hh, r]) and not out[i, r, hh].any()
                    continue
                qh = inp.q_lora[i, r] @ w.w_uq[:, hh]              # [nope + rope]
                pos = n - s_q + r
                q_pe = R.rope(qh[nope:], torch.tensor(pos), w.rope_theta)
                kv = torch.stack([token(inp.k_cache, inp.block_table, i, t)[0]
                                  for t in range(m)])
                k_nope = kv[:, :rank] @ w.w_uk[hh].T                # [m, nope]
                s = (k_nope @ qh[:nope] + kv[:, rank:] @ q_pe) * inp.softmax_scale
                vv = kv[:, :rank] @ w.w_uv[hh]
                assert torch.allclose(out[i, r, hh], torch.softmax(s, 0) @ vv, atol=1e-12)
                assert lse[i, hh, r].item() == pytest.approx(
                    torch.logsumexp(s, 0).item(), abs=1e-12)


def test_absorb_query_positions_and_latent_part():
    lens, s_q, rope = [5, 30], 3, 16
    inp = fused_case(lens, s_q, 2, 64, 16, rope, 32, 16, 16, seed=1)
    q = R.absorb_query(inp.q_lora, inp.weights, inp.cache_seqlens, s_q, rope, F64)
    assert q.shape == (2, s_q, 2, 64 + rope)
    full = torch.einsum("bsr,rhe->bshe", inp.q_lora, inp.weights.w_uq)
    for i, n in enumerate(lens):
        for r in range(s_q):
            expect_pe = R.rope(full[i, r, :, 16:], torch.tensor(n - s_q + r),
                               inp.weights.rope_theta)
            assert torch.allclose(q[i, r, :, 64:], expect_pe, atol=1e-13)
            for hh in range(2):
                lat = full[i, r, hh, :16] @ inp.weights.w_uk[hh]
                assert torch.allclose(q[i, r, hh, :64], lat, atol=1e-13)


def test_fused_rejects_bad_shapes():
    inp = fused_case([4], 1, 2, 16, 8, 8, 12, 8, 4, seed=0)
    args = list(fused_args(inp, 8))
    with pytest.raises(InputError):
        R.fused_absorbed(*args[:7], 6, F64)                        # rope_dim disagrees with cache
    bad = FusedWeights(inp.weights.w_uq, inp.weights.w_uk[:, :4], inp.weights.w_uv)
    with pytest.raises(InputError):
        R.fused_plain(args[0], bad, *args[2:])
    with pytest.raises(InputError):
        R.absorb_query(inp.q_lora, inp.weights, inp.cache_seqlens, 2, 8, F64)


def test_run_dispatches_both_operators():
    p = Problem(heads=4)
    inp = make_inputs(p, 2, [3, 90], seed=2)
    res = R.run(inp)
    out, lse = R.attention(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, dv=512,
                           softmax_scale=inp.softmax_scale)
    assert torch.equal(res.out, out) and torch.equal(res.lse, lse)
    assert res.out.shape == (2, 1, 4, 512)
    pf = Problem(heads=4, fused=True)
    inpf = make_inputs(pf, 2, [3, 90], s_q=2, seed=2)
    resf = R.run(inpf, F64)
    out, lse = R.fused_absorbed(inpf.q_lora, inpf.weights, inpf.k_cache, inpf.block_table,
                                inpf.cache_seqlens, inpf.softmax_scale, True, 64, F64)
    assert torch.equal(resf.out, out) and torch.equal(resf.lse, lse)
    assert resf.out.shape == (2, 2, 4, 128)
    with pytest.raises(InputError):
        R.run(MlaInputs(None, inp.k_cache, inp.block_table, inp.cache_seqlens, 0.1))


# ---- GPU ----------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_matches_cpu():
    for fused in (False, True):
        p = Problem(heads=16, fused=fused)
        inp = make_inputs(p, 3, [0, 77, 300], s_q=2, seed=3)
        cpu = R.run(inp, F64)
        gpu = R.run(inp.to("cuda"), F64)
        assert gpu.out.is_cuda and gpu.lse.is_cuda
        assert_same(gpu.out.cpu(), cpu.out, atol=1e-10)
        assert_same(gpu.lse.cpu(), cpu.lse, atol=1e-10)


# ---- e4m3 MMAs' rounding points (fp8_mma = "mma", mla_fp8_regs.cuh) ----------------------

def test_q_e4m3_quantizes_each_row_by_its_own_amax():
    q = torch.randn(2, 1, 3, 576, dtype=torch.float64).to(torch.bfloat16)
    q[0, 0, 1] *= 1e-3                      # a small row: its own scale, not the others'
    q[1, 0, 2] = 0                          # a zero row: scale 1, stays zero
    q[1, 0, 0, 7] = float("inf")            # a row with an inf: NaN (never a finite answer)
    d = R.quantize_q_e4m3(q)
    assert d.dtype == torch.float64
    assert torch.equal(d[1, 0, 2], torch.zeros(576, dtype=torch.float64))
    assert torch.isnan(d[1, 0, 0]).all() and torch.isfinite(d[0]).all()
    amax = q[0, 0, 1].double().abs().max()
    assert float(d[0, 0, 1].abs().max()) == pytest.approx(float(amax), rel=1e-6)
    # e4m3 keeps 3 fraction bits: within 2^-4 of each value relative to the row's amax / 448
    err = (d[0, 0, 1] - q[0, 0, 1].double()).abs()
    assert float(err.max()) <= float(amax) * 2 ** -4
    assert float(err.max()) > 0


def test_q_scale_is_the_kernels_ieee_quotient_however_the_device_divides():
    """The kernel's q_scale is __fdiv_rn(amax, 448); CUDA torch divides a tensor by a Python
    scalar as a product with its reciprocal, one float32 step off at times (a GPU verify
    failed on it: its reference rounded a row's e4m3 values against another scale).  The
    reference's float64 quotient, rounded to float32, must equal the IEEE float32 quotient
    whether the float64 step divides or multiplies by the reciprocal: over every exponent."""
    g = torch.Generator().manual_seed(3)
    m = torch.randint(1 << 23, 1 << 24, (1 << 16,), generator=g).double()
    e = torch.randint(-126, 128, (1 << 16,), generator=g).double()
    x = (m * torch.exp2(e - 23)).float()
    x = x[torch.isfinite(x)]
    ieee = x / torch.full_like(x, 448.0)                     # tensor / tensor: IEEE
    assert torch.equal((x.double() / 448.0).float(), ieee)
    assert torch.equal((x.double() * (1.0 / 448.0)).float(), ieee)
    assert not torch.equal(x * (1.0 / 448.0), ieee)           # what a reciprocal does in fp32
    amax = R.quantize_q_e4m3(torch.stack([x[:576], x[576:1152]])[:, None, None].bfloat16())
    assert torch.isfinite(amax).all()


def test_p_e4m3_rounds_at_an_integer_max_and_sums_the_rounded_weights():
    s = torch.tensor([[[[0.0, -0.3, -1.7, -9.0]]]], dtype=torch.float64)   # [1, 1, 1, 4]
    vis = torch.ones(1, 1, 4, dtype=torch.bool)
    p, lse = R._softmax(s, vis, torch.float8_e4m3fn)
    top = math.ceil(0.0 / math.log(2)) * math.log(2)
    e = torch.exp(s - top).float().to(torch.float8_e4m3fn).double()
    assert torch.allclose(p, e / e.sum())
    assert float(lse) == pytest.approx(top + math.log(float(e.sum())))
    assert float(p.sum()) == pytest.approx(1.0)


def test_mma_rounding_points_measured_against_the_exact_reference():
    """The e4m3 MMA mode's own error (Q per row and P in e4m3) against the float64 exact
    reference on randn workloads: out within 2 % of max |out| (0.3 % rms measured), lse
    within 0.1 (0.05 measured on a 1-key sequence, where lse is one score)."""
    from mlagen.problem import make_inputs
    from mlagen.schedule.records import Problem
    prob = Problem(page_size=64, dtype="bf16", max_s_q=1, kv_format="fp8_e4m3")
    inp = make_inputs(prob, 3, [1, 700, 4100], s_q=1, heads=16, seed=1)
    exact = R.run(inp, torch.float64)
    mma = R.run(inp, torch.float64, rounded=("q_e4m3", "p_e4m3"))
    scale = float(exact.out.abs().max())
    assert float((mma.out - exact.out).abs().max()) < 0.02 * scale
    assert float((mma.lse - exact.lse).abs().max()) < 0.1
    rms = (mma.out - exact.out).pow(2).mean().sqrt() / exact.out.pow(2).mean().sqrt()
    assert 1e-4 < float(rms) < 1e-2


def test_the_mma_oracle_separates_the_rounded_reference_from_the_exact_one():
    """verify's allowances for e4m3 MMAs are tight enough that the unrounded reference (a
    kernel that skipped a rounding point, or rounded Q with the wrong scale) fails."""
    from mlagen.problem import make_inputs
    from mlagen.verify.compare import compare_tensor, tolerances_for
    from mlagen.verify.oracle import oracle_for
    s = _mma_schedule()
    inp = make_inputs(s.problem, 3, [64, 65, 3000], s_q=1, heads=16, seed=1)
    want = oracle_for(s)(inp)
    tol = tolerances_for("bf16")
    slack = want.extra["slack"]
    for name in ("out", "lse"):
        assert compare_tensor(name, getattr(want, name), getattr(want, name), tol[name],
                              slack=slack[name]).ok
    exact = R.run(inp, torch.float64)
    assert not compare_tensor("out", exact.out, want.out, tol["out"], slack=slack["out"],
                              cos_bar=want.extra["cos_bar"]).ok


def test_the_mma_oracle_catches_its_two_planted_faults_modelled():
    """Models of the e4m3 MMAs' two planted faults: P^T written in plain key order
    (mma_p_keys_unpermuted: each weight meets the V of the key the V^T fragments hold at
    its position) and every row's scores scaled by the first row's q_scale
    (mma_q_scale_first_row).  verify's allowances (flips near a rounding point, the fp8
    accumulation, its cosine bar) must not hide them; the model without a fault passes."""
    from mlagen.problem import make_inputs
    from mlagen.verify.compare import compare_tensor, tolerances_for
    from mlagen.verify.oracle import _keys, oracle_for

    def kpos(key):   # mla_fp8_regs.cuh's p_kpos
        return 16 * (key >> 4) + 4 * ((key & 7) >> 1) + 2 * ((key >> 3) & 1) + (key & 1)

    held = {kpos(k): k for k in range(64)}            # position -> the key V^T holds there
    assert sorted(held) == list(range(64))
    s = _mma_schedule()
    inp = make_inputs(s.problem, 2, [200, 130], s_q=1, heads=16, seed=3)
    want = oracle_for(s)(inp)
    q = R.quantize_q_e4m3(inp.q)
    tol = tolerances_for("bf16")["out"]

    def model(at: dict, q=q):
        outs = []
        for i, n in enumerate(inp.cache_seqlens.tolist()):
            kv = _keys(inp, i, n)
            x = torch.einsum("shd,td->sht", q[i], kv) * inp.softmax_scale
            top = torch.ceil(x.amax(-1, keepdim=True) / math.log(2)) * math.log(2)
            e = torch.exp(x - top).float().to(torch.float8_e4m3fn).double()
            src = [64 * (t // 64) + at[t % 64] for t in range(n)]
            v = torch.stack([kv[j, :512] if j < n else torch.zeros(512, dtype=torch.float64)
                             for j in src])
            outs.append(torch.einsum("sht,tc->shc", e, v) / e.sum(-1, keepdim=True))
        return compare_tensor("out", torch.stack(outs), want.out, tol,
                              slack=want.extra["slack"]["out"], cos_bar=want.extra["cos_bar"])

    plain = {k: k for k in range(64)}
    assert model(plain).ok          # the model itself, without a fault
    rep = model(held)
    assert not rep.ok
    assert rep.n_bad > want.out.numel() // 4, rep.summary()
    # the first (token, head) row's scale for all: scores q8 . k * qs_0 for q8 = q / qs_row
    qs = inp.q.float().abs().amax(-1, keepdim=True).double() / 448.0
    first = qs.flatten(1, 2)[:, :1].unsqueeze(-1)       # each request's first row
    rep = model(plain, q * first / qs)
    assert not rep.ok and rep.n_bad > 0, rep.summary()


def test_the_mma_oracle_cosine_bar_rises_only_with_large_scores():
    """e4m3 MMAs accumulate a score in fewer bits than fp32: where every score of a row sits
    600 nats up (adversarial very_large), that error is ~0.1 nat a key and moves a
    near-uniform mean by percents; an H100 gave cos-diff 7.1e-3 on this case (batch 3,
    seqlens 512 / 65 / 0, seed 3).  The cosine bar (the weights' flips, MMA_COS_BAR, plus
    that expectation) covers it there and stays within twice MMA_COS_BAR on randn,
    dominant and ties, four times on a steep rise; lse's bar stays near MMA_COS_BAR."""
    from mlagen.verify import adversarial
    from mlagen.verify.oracle import MMA_COS_BAR, oracle_for
    s = _mma_schedule()
    base = make_inputs(s.problem, 3, [512, 65, 0], s_q=1, heads=16, seed=3)
    bars = {pat: oracle_for(s)(adversarial.apply(base, pat, 0)).extra["cos_bar"]
            for pat in ("randn", "rising", "dominant", "ties", "very_large")}
    assert bars["very_large"]["out"] > 2 * 7.1e-3, bars
    assert all(MMA_COS_BAR <= bars[p]["out"] < 2 * MMA_COS_BAR
               for p in ("randn", "dominant", "ties")), bars
    assert MMA_COS_BAR <= bars["rising"]["out"] < 4 * MMA_COS_BAR, bars
    assert all(MMA_COS_BAR <= b["lse"] < 1.01 * MMA_COS_BAR for p, b in bars.items()
               if p != "ties"), bars
    # equal keys' score errors add up rather than cancel: lse's expectation grows, a little
    assert 1.01 * MMA_COS_BAR <= bars["ties"]["lse"] < 1.05 * MMA_COS_BAR, bars


def _mma_kernel_model(inp: MlaInputs, piece: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The e4m3-MMA kernel's softmax as mla_wgmma_rows.cuh rounds it, in float64 with exact
    scores (no fp8 accumulation error): 64-key blocks in order, an integer running max (log2
    units) that moves only past kRescaleSlack (8), e4m3 P at that max, the rounded P summed;
    pieces of `piece` keys (0: whole sequences) merged as the combine does.  -> out, lse."""
    from mlagen.verify.oracle import _keys

    q = R.quantize_q_e4m3(inp.q)
    b, s_q, h, _ = q.shape
    dv = inp.dv
    out = torch.zeros(b, s_q, h, dv, dtype=F64)
    lse = torch.full((b, h, s_q), math.inf, dtype=F64)
    for i, n in enumerate(inp.cache_seqlens.tolist()):
        if n == 0:
            continue
        pages = inp.block_table[i, :-(-n // inp.page_size)]
        if bool(((pages < 0) | (pages >= inp.k_cache.shape[0])).any()):
            out[i], lse[i] = math.nan, math.nan       # a bad table entry: the sequence is NaN
            continue
        kv = _keys(inp, i, n)
        x = torch.einsum("shd,td->sht", q[i], kv) * (inp.softmax_scale / math.log(2))
        if inp.causal:
            last = n - s_q + torch.arange(s_q)
            x = x.masked_fill(torch.arange(n)[None, None, :] > last[:, None, None], -math.inf)
        parts = []
        for p0 in range(0, n, piece or n):
            m = torch.full((s_q, h), -math.inf, dtype=F64)
            lsum = torch.zeros(s_q, h, dtype=F64)
            acc = torch.zeros(s_q, h, dv, dtype=F64)
            for k0 in range(p0, min(n, p0 + (piece or n)), 64):
                xb = x[..., k0:min(k0 + 64, n)]
                bm = torch.ceil(xb.nan_to_num(nan=-math.inf).amax(-1))   # fmaxf skips NaN
                move = bm > m + 8
                alpha = torch.where(move, torch.exp2(m - bm), 1.0)
                m = torch.where(move, bm, m)
                pe = torch.exp2(xb - m[..., None]).float().to(torch.float8_e4m3fn).double()
                lsum = lsum * alpha + pe.sum(-1)
                acc = acc * alpha[..., None] + torch.einsum("sht,tc->shc", pe,
                                                             kv[k0:k0 + pe.shape[-1], :dv])
            parts.append((m, lsum, acc))
        top = torch.stack([p[0] for p in parts]).amax(0)
        w = [torch.exp2(p[0] - top).nan_to_num(nan=0.0) for p in parts]
        total = sum(wj * p[1] for wj, p in zip(w, parts))
        seen = total != 0                                   # a row that sees no key: 0, +inf
        out[i] = torch.where(seen[..., None], sum(wj[..., None] * p[2] for wj, p in zip(w, parts))
                             / total[..., None], 0.0)
        lse[i] = torch.where(seen, (top + torch.log2(total)) * math.log(2), math.inf).T
    return out, lse


def _mma_schedule():
    from mlagen.schedule.records import Schedule
    return Schedule.build(target="hopper", mainloop="wgmma", block_kv=64, buffers=2, warps=8,
                          rows_per_tile=16, kv_format="fp8_e4m3", fp8_converters=0,
                          fp8_raw_slots=4, fp8_mma="mma")


def _mma_model_fits(s, inp, piece=0):
    from mlagen.verify.compare import compare_tensor, tolerances_for
    from mlagen.verify.oracle import oracle_for
    want = oracle_for(s)(inp)
    out, lse = _mma_kernel_model(inp, piece)
    tol = tolerances_for("bf16")
    return (compare_tensor("out", out, want.out, tol["out"], slack=want.extra["slack"]["out"],
                           cos_bar=want.extra["cos_bar"]),
            compare_tensor("lse", lse, want.lse, tol["lse"], slack=want.extra["slack"]["lse"],
                           cos_bar=want.extra["cos_bar"]))


def test_the_mma_oracle_covers_weights_the_reference_flushes_and_the_kernel_keeps(monkeypatch):
    """The reference rounds P to e4m3 at the final max, where a weight under 2^-10 is 0; the
    kernel rounds it at its running max, up to 8 binades lower (or at a piece's own max),
    where it is a normal number: it keeps what the reference drops, always upward.  Four
    thousand keys 11 binades under one late key: 4000 x 2^-11 of the sum, lse off by
    ln(2.95).  The allowance covers that bias as a sum, not as random flips."""
    from mlagen.verify import adversarial
    s = _mma_schedule()
    n = 4000
    monkeypatch.setattr(adversarial, "DOMINANT_NATS", 11 * math.log(2))
    arg = next(a for a in range(10000) if (a * 2654435761) % n >= n - 30)   # a late key
    base = make_inputs(s.problem, 1, [n], s_q=1, heads=16, seed=5)
    inp = adversarial.apply(base, "dominant", arg)
    _, lse = _mma_kernel_model(inp)
    want = R.run(inp, dtype=F64, rounded=("q_e4m3", "p_e4m3"))
    assert (lse - want.lse).abs().max() > 0.3       # the bias is there
    for piece in (0, 256):
        o, l = _mma_model_fits(s, inp, piece)
        assert o.ok and l.ok, (piece, o.summary(), l.summary())


def test_the_mma_oracle_covers_equal_keys_flipping_together():
    """Adversarial "ties" (every key one key): where the row's weight sits near an e4m3
    rounding point, a score error flips every key's weight the same way, so lse moves by a
    whole step (on an H100: 0.087 for 488 equal keys, against an allowance of 0.053 that
    summed their flips as independent).  The allowance must cover that shift on every row
    whose weight is near a rounding point."""
    from mlagen.verify import adversarial
    from mlagen.verify.oracle import _E4M3_NEAR, _near_e4m3_midpoint, oracle_for
    s = _mma_schedule()
    inp = adversarial.apply(make_inputs(s.problem, 1, [488], s_q=1, heads=64, seed=967),
                            "ties", 0)
    want = oracle_for(s)(inp)
    from mlagen.verify.oracle import _keys
    q = R.quantize_q_e4m3(inp.q)[0, 0]                               # [h, d]
    x = (q @ _keys(inp, 0, 488)[0]) * inp.softmax_scale / math.log(2)
    e = torch.exp2(x - torch.ceil(x))                                # one weight a row
    near = _near_e4m3_midpoint(e, torch.full_like(e, _E4M3_NEAR))
    assert int(near.sum()) >= 3
    lo = (e * (1 - _E4M3_NEAR)).float().to(torch.float8_e4m3fn).double()
    hi = (e * (1 + _E4M3_NEAR)).float().to(torch.float8_e4m3fn).double()
    shift = torch.log(hi / lo)                                       # the whole flip
    slack = want.extra["slack"]["lse"][0, :, 0]
    assert bool((slack[near] >= shift[near]).all()), (slack[near], shift[near])
    assert float(shift[near].min()) > 0.05


@pytest.mark.parametrize("profile,piece", [("smoke", 0), ("ci", 64)])
def test_verify_passes_a_model_of_the_mma_kernels_rounding(profile, piece):
    """verify's draws (smoke with every path case, ci) on the e4m3-MMA example schedule, run
    through _mma_kernel_model instead of the GPU (whole sequences, or 64-key pieces each
    rounding at its own max): the oracle's allowances must cover the kernel's own rounding
    (the oracle at d177e5b did not: a rising ci draw gave cos-diff 1.3e-4 against its 1e-4,
    as the GPU's 1.4e-4)."""
    from mlagen.problem import MlaOutputs
    from mlagen.schedule import load
    from mlagen.verify.runner import verify
    from mlagen.verify.strategies import path_cases
    s = load(Path(__file__).resolve().parent.parent / "schedules" / "hopper_fp8_e4m3_mma.toml")

    def run(inputs, **_):
        out, lse = _mma_kernel_model(inputs, piece)
        return MlaOutputs(out.to(torch.bfloat16), lse.float())

    explicit = [(c, None) for c in path_cases(s)] if profile == "smoke" else []
    r = verify(s, profile=profile, runner=run, isolate=False, progress=False, device="cpu",
               save_failures=False, explicit=explicit)
    assert r.ok and r.examples_run >= 30, r.failure and r.failure.message
