"""Token-sparse decode through the Hopper API on a GPU (the wgmma kernels' sparse modes):
against mlagen.reference.sparse_attention over hypothesis-drawn h_q 1..128, s_q 1..8, topk
(1, not a multiple of 64, several blocks), page sizes 1..256, invalid (-1) and repeated
indices, topk_length (0 included), sinks (±inf included), all-invalid rows, NaN in every
cache slot no index names, adversarial scores; slots past the cache (NaN and flag 1);
FlashMLA 9241ae3's scheduling object reused across calls; graph capture.  Two pools
(extra_k_cache, extra_indices_in_kvcache, extra_topk_length) in one softmax: each pool's page
size, lengths (0 included), invalid entries and NaN-filled unnamed slots, the extra cache
below and above the main one, a slot past the extra cache."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlagen import kvformat
from mlagen.errors import InputError
from mlagen.problem import make_sparse_inputs
from mlagen.reference import sparse_attention
from mlagen.schedule.records import Problem

from hopper_util import assert_close

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

FORMATS = ("bf16", "fp8_ds_mla")


def api():
    from mlagen.backends.hopper import api as a
    return a


def inputs(kv, seqlens, s_q, h_q, topk, page=64, seed=0, invalid=0.0, repeats=0.0,
           topk_length=False, sinks=False, infinite_sinks=False):
    prob = Problem(page_size=page, dtype="bf16", max_s_q=s_q, causal=False,
                   kv_format="" if kv == "bf16" else kv, attention="sparse", topk=topk,
                   sinks=sinks)
    return make_sparse_inputs(prob, len(seqlens), seqlens, s_q=s_q, heads=h_q, seed=seed,
                              invalid=invalid, repeats=repeats, topk_length=topk_length,
                              infinite_sinks=infinite_sinks, device="cuda")


def run(inp, sched=None, schedule=None):
    a = api()
    pool = inp.pools[0]
    if sched is None:
        sched, _ = a.get_mla_metadata()
    return a.flash_mla_with_kvcache(inp.q, pool.k_cache, None, None, 512, sched,
                                    softmax_scale=inp.softmax_scale,
                                    is_fp8_kvcache=pool.k_cache.dtype != torch.bfloat16,
                                    indices=pool.indices, attn_sink=inp.attn_sink,
                                    topk_length=pool.topk_length, schedule=schedule)


def check(inp, sched=None, schedule=None):
    """out within abs 2^-8 max|V| OR rel 2.01/128 with cos-diff < 5e-6 of the float64
    reference (P rounded to bf16 in the kernel), lse within 1e-6 OR 8.01/65536; NaN and
    inf masks equal."""
    out, lse = run(inp, sched, schedule)
    torch.cuda.synchronize()
    ref_o, ref_l = sparse_attention(inp.q, inp.pools, softmax_scale=inp.softmax_scale,
                                    attn_sink=inp.attn_sink, dtype=torch.float64)
    pool = inp.pools[0]
    vals = (kvformat.dequantize(pool.k_cache, pool.kv_format, None)
            if pool.k_cache.dtype != torch.bfloat16 else pool.k_cache.double())[..., :512]
    vmax = float(torch.nan_to_num(vals, 0.0, 0.0, 0.0).abs().max())
    assert_close(out.float(), ref_o.to(out.dtype).float(), "out", max(8e-4, vmax / 256),
                 2.01 / 128, 5e-6)
    assert_close(lse, ref_l.float(), "lse", 1e-6, 8.01 / 65536)
    return out, lse


@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("seqlens,s_q,h_q,topk,page", [
    ([100, 3000], 1, 16, 64, 64),
    ([5000, 70], 2, 128, 2048, 64),      # V3.2's topk, 32-row tiles, lengths below topk
    ([300], 1, 1, 1, 1),                 # topk 1, page 1
    ([1000, 1000, 17], 3, 20, 100, 16),  # topk not a multiple of 64
    ([4097], 8, 16, 777, 256),
    ([64, 0], 2, 64, 130, 32),           # a sequence with no key: all-invalid rows
    ([2500, 3000, 1, 900], 8, 128, 2048, 100),
    ([3000, 7], 4, 100, 65, 16),
])
def test_cases(kv, seqlens, s_q, h_q, topk, page):
    check(inputs(kv, seqlens, s_q, h_q, topk, page, seed=1, invalid=0.2, repeats=0.1))


@pytest.mark.parametrize("seqlens,s_q,h_q,topk,page,length", [
    ([5000, 70], 2, 128, 2048, 64, False),
    ([64, 0], 2, 64, 130, 32, False),
    ([2500, 3000, 1, 900], 3, 100, 700, 100, True),
    ([300], 1, 40, 1, 1, True),
])
def test_fp8_ds_mla_in_the_64_row_kernel(seqlens, s_q, h_q, topk, page, length):
    """The 64-row kernel's fp8_ds_mla mode (its producer converts), by an explicit schedule
    (the default takes it only where wide_rows says: here the rows' lengths vary freely)."""
    from mlagen.backends.hopper import sparse
    from mlagen.schedule.records import Schedule
    s = Schedule.build(target="hopper", dtype="bf16", kv_format="fp8_ds_mla",
                       attention="sparse", topk=2048, causal=False, rows_per_tile=64,
                       block_kv=64, buffers=2, warps=8, mainloop="wgmma")
    check(inputs("fp8_ds_mla", seqlens, s_q, h_q, topk, page, seed=5, invalid=0.2,
                 repeats=0.1, topk_length=length), schedule=s)
    assert sparse.sparse_schedule(h_q, "fp8_ds_mla", s).mapping.rows_per_tile == 64


@pytest.mark.parametrize("kv", FORMATS)
def test_topk_length_and_sinks(kv):
    inp = inputs(kv, [3000, 2000, 50, 900], 2, 32, 300, 64, seed=2, invalid=0.1,
                 topk_length=True, sinks=True, infinite_sinks=True)
    inp.pools[0].topk_length[0] = 0                  # a sequence with topk_length 0
    out, lse = check(inp)
    assert torch.isinf(lse[0]).all() and (out[0] == 0).all()
    assert (out[:, :, 0] == 0).all()                 # sink +inf: 0


@pytest.mark.parametrize("kv", FORMATS)
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(h_q=st.integers(1, 128), s_q=st.integers(1, 8),
       topk=st.sampled_from([1, 2, 63, 64, 65, 129, 500, 2048]),
       page=st.sampled_from([1, 16, 64, 100, 256]),
       seqlens=st.lists(st.integers(0, 3000), min_size=1, max_size=4),
       invalid=st.sampled_from([0.0, 0.3, 1.0]), repeats=st.sampled_from([0.0, 0.2]),
       topk_length=st.booleans(), sinks=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_drawn(kv, h_q, s_q, topk, page, seqlens, invalid, repeats, topk_length, sinks, seed):
    print(dict(kv=kv, h_q=h_q, s_q=s_q, topk=topk, page=page, seqlens=seqlens,
               invalid=invalid, repeats=repeats, topk_length=topk_length, sinks=sinks,
               seed=seed), flush=True)
    check(inputs(kv, seqlens, s_q, h_q, topk, page, seed, invalid, repeats, topk_length,
                 sinks, sinks))


@pytest.mark.parametrize("kv", FORMATS)
def test_adversarial_scores(kv):
    """A dominant key (a scaled copy of q's head-0 direction at one named slot) and keys of
    rising scores: the running max moves late and far."""
    inp = inputs("bf16", [4000, 3000], 2, 64, 1000, 64, seed=4, invalid=0.1)
    pool = inp.pools[0]
    cache = pool.k_cache.clone()
    page = cache.shape[1]
    flat = cache.view(-1, 576)
    idx = pool.indices.long()
    # rising: key slot s gets s * 1e-3 in the rope column 512 (every query's 512 set to 1)
    q = inp.q.clone()
    q[..., 512] = 1.0
    valid = idx[idx >= 0].unique()
    flat[valid, 512] = (torch.arange(valid.numel(), device="cuda") * 0.05).to(flat.dtype)
    # dominant: the last valid entry of row (0, 0)
    last = int(idx[0, 0][idx[0, 0] >= 0][-1])
    flat[last, 512] = 3000.0
    if kv == "fp8_ds_mla":
        cache = kvformat.quantize(cache.float(), kv)
    inp = replace(inp, q=q, pools=[replace(pool, k_cache=cache, kv_format=kv)])
    assert page == 64
    check(inp)


@pytest.mark.parametrize("kv", FORMATS)
def test_slot_past_the_cache_gives_nan_and_flag(kv):
    a = api()
    inp = inputs(kv, [500, 500], 1, 16, 128, 64, seed=5)
    pool = inp.pools[0]
    cap = pool.k_cache.shape[0] * pool.k_cache.shape[1]
    bad = pool.indices.clone()
    bad[1, 0, 3] = cap                                  # one past the last slot
    a.device_error_flags().zero_()
    out, lse = run(replace(inp, pools=[replace(pool, indices=bad)]))
    torch.cuda.synchronize()
    assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all()
    assert torch.isfinite(out[0]).all()
    with pytest.raises(InputError):
        a.check_device_errors()


def test_sched_meta_is_filled_once_and_checked():
    a = api()
    inp = inputs("fp8_ds_mla", [2000, 100], 2, 16, 256, 64, seed=6)
    sched, none = a.get_mla_metadata()
    assert none is None and not sched.have_initialized
    o1, l1 = run(inp, sched)
    assert sched.have_initialized and sched.tile_scheduler_metadata is not None
    o2, l2 = run(inp, sched)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    other = inputs("fp8_ds_mla", [2000, 100], 1, 16, 256, 64, seed=6)
    with pytest.raises(InputError):
        run(other, sched)


def test_graph_capture():
    inp = inputs("fp8_ds_mla", [3000, 800, 64], 2, 128, 2048, 64, seed=7, sinks=True,
                 topk_length=True)
    sched, _ = api().get_mla_metadata()
    ref = run(inp, sched)                                # warm: plan, build, metadata
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = run(inp, sched)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1])


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(b=st.integers(1, 40), s_q=st.integers(1, 8), topk=st.integers(1, 300),
       extra_topk=st.sampled_from([0, 1, 77]), data=st.data())
def test_row_lengths_in_one_launch_match_torch(b, s_q, topk, extra_topk, data):
    """The call's one length launch (DecodePlan.sparse_lengths) against row_lengths and
    two_pool_lengths: lengths absent, negative, 0, past topk, a strided view, rows past
    one CTA's 256."""
    from mlagen.backends.hopper import ops, sparse

    def lengths(cap):
        kind = data.draw(st.sampled_from(["none", "plain", "strided"]))
        if kind == "none":
            return None
        vals = data.draw(st.lists(st.integers(-3, cap + 5), min_size=b, max_size=b))
        t = torch.tensor(vals, dtype=torch.int32, device="cuda")
        if kind == "strided":
            t = torch.stack([t, torch.full_like(t, -7)], 1).reshape(-1)[::2]
        return t

    tl, xl = lengths(topk), lengths(extra_topk) if extra_topk else None
    key = sparse._library(16, "bf16", None, False, 2 if extra_topk else 1, 576)[0]
    q = torch.zeros(b * s_q, 1, 16, 576, dtype=torch.bfloat16, device="cuda")
    k = torch.zeros(1, 64, 1, 576, dtype=torch.bfloat16, device="cuda")
    plan = ops.DecodePlan(q, k, torch.zeros(b * s_q, topk, dtype=torch.int32, device="cuda"),
                          1, 1.0, False, key)
    lens, len1 = plan.sparse_lengths(tl, xl, s_q, topk, extra_topk)
    want = sparse.row_lengths(tl, b, s_q, topk, "cuda")
    if extra_topk:
        want, want1 = sparse.two_pool_lengths(want, sparse.row_lengths(xl, b, s_q, extra_topk,
                                                                       "cuda"))
        assert len1.is_contiguous() and torch.equal(len1, want1)
    else:
        assert len1 is None
    assert lens.is_contiguous() and torch.equal(lens, want)


def test_dense_call_with_a_sched_meta():
    """FlashMLA 9241ae3's dense form: get_mla_metadata() then the call fills it."""
    from mlagen.problem import make_inputs
    a = api()
    inp = make_inputs(Problem(page_size=64, dtype="bf16", max_s_q=2), 2, [700, 64], s_q=2,
                      heads=16, seed=0, device="cuda")
    sched, _ = a.get_mla_metadata()
    o, l = a.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens,
                                    512, sched, causal=True)
    md, ns = a.get_mla_metadata(inp.cache_seqlens, 32, 1)
    o2, l2 = a.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens,
                                      512, md, ns, causal=True)
    torch.cuda.synchronize()
    assert torch.equal(o, o2) and torch.equal(l, l2)
    assert math.isfinite(float(l.sum()))


# ------------------------------------------------------------------ two pools of keys
def pool_inputs(kv, seqlens, extra_seqlens, s_q, h_q, topk=2048, extra_topk=512, page=64,
                extra_page=2, seed=0, invalid=0.2, topk_length=True, sinks=False,
                lengths=None):
    """Two pools in one format, NaN in every slot of either cache that no valid entry names
    (mlagen.verify.sparse.nan_unnamed), on the GPU.  lengths: (topk_length,
    extra_topk_length) lists set before the NaN fill (so it follows them)."""
    from mlagen.verify.sparse import nan_unnamed
    prob = Problem(page_size=page, dtype="bf16", max_s_q=s_q, causal=False,
                   kv_format="" if kv == "bf16" else kv, attention="sparse", topk=topk,
                   extra_topk=extra_topk, extra_page_size=extra_page, sinks=sinks)
    inp = make_sparse_inputs(prob, len(seqlens), seqlens, s_q=s_q, heads=h_q, seed=seed,
                             extra_seqlens=extra_seqlens, invalid=invalid,
                             topk_length=topk_length or lengths is not None)
    if lengths is not None:
        for pool, tl in zip(inp.pools, lengths):
            pool.topk_length[:] = torch.tensor(tl, dtype=torch.int32)
    inp = nan_unnamed(inp, 512)
    mv = lambda t: None if t is None else t.cuda()   # noqa: E731
    return replace(inp, q=inp.q.cuda(), attn_sink=mv(inp.attn_sink),
                   pools=[replace(p, k_cache=p.k_cache.cuda(), indices=p.indices.cuda(),
                                  topk_length=mv(p.topk_length)) for p in inp.pools])


def run_pools(inp, sched=None, schedule=None):
    a = api()
    main, extra = inp.pools
    if sched is None:
        sched, _ = a.get_mla_metadata()
    return a.flash_mla_with_kvcache(inp.q, main.k_cache, None, None, 512, sched,
                                    softmax_scale=inp.softmax_scale,
                                    is_fp8_kvcache=main.k_cache.dtype != torch.bfloat16,
                                    indices=main.indices, attn_sink=inp.attn_sink,
                                    topk_length=main.topk_length, extra_k_cache=extra.k_cache,
                                    extra_indices_in_kvcache=extra.indices,
                                    extra_topk_length=extra.topk_length, schedule=schedule)


def check_pools(inp, sched=None, schedule=None):
    """check()'s bounds against the reference over both pools."""
    out, lse = run_pools(inp, sched, schedule)
    torch.cuda.synchronize()
    ref_o, ref_l = sparse_attention(inp.q, inp.pools, softmax_scale=inp.softmax_scale,
                                    attn_sink=inp.attn_sink, dtype=torch.float64)
    vmax = 0.0
    for pool in inp.pools:
        vals = (kvformat.dequantize(pool.k_cache, pool.kv_format, None)
                if pool.k_cache.dtype != torch.bfloat16 else pool.k_cache.double())[..., :512]
        vmax = max(vmax, float(torch.nan_to_num(vals, 0.0, 0.0, 0.0).abs().max()))
    assert_close(out.float(), ref_o.to(out.dtype).float(), "out", max(8e-4, vmax / 256),
                 2.01 / 128, 5e-6)
    assert_close(lse, ref_l.float(), "lse", 1e-6, 8.01 / 65536)
    return out, lse


@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("h_q", [16, 128])
@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("extra_page", [64, 2])
def test_two_pools(kv, h_q, s_q, extra_page):
    # the second row's extra list is empty (length 0 or no sequence), the third's main one
    inp = pool_inputs(kv, [5000, 900, 0], [3000, 0, 700], s_q, h_q, extra_page=extra_page,
                      seed=11, sinks=True)
    out, lse = check_pools(inp)
    assert torch.isfinite(lse[0]).all()


@pytest.mark.parametrize("kv", FORMATS)
def test_two_pools_lengths_zero_and_past_topk(kv):
    inp = pool_inputs(kv, [3000, 3000, 3000, 3000], [800, 800, 800, 800], 2, 16, topk=300,
                      extra_topk=130, extra_page=16, seed=12,
                      lengths=([0, 300, 5000, 0], [0, 0, 1, 130]))
    out, lse = check_pools(inp)
    assert torch.isinf(lse[0]).all() and (out[0] == 0).all()    # no key in either pool
    assert torch.isfinite(lse[1:]).all()


@pytest.mark.parametrize("kv", FORMATS)
def test_two_pools_in_the_64_row_kernel(kv):
    from mlagen.schedule.records import Schedule
    s = Schedule.build(target="hopper", dtype="bf16", kv_format="" if kv == "bf16" else kv,
                       attention="sparse", topk=2048, extra_topk=512, causal=False,
                       rows_per_tile=64, block_kv=64, buffers=2, warps=8, mainloop="wgmma")
    check_pools(pool_inputs(kv, [4000, 100, 2500], [600, 3000, 0], 2, 128, topk=1000,
                            extra_topk=300, extra_page=2, seed=13, sinks=True), schedule=s)


@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("extra_first", [True, False])
def test_extra_cache_below_and_above_the_main_one(kv, extra_first):
    """The gather's offsets are from the main cache: an extra cache at a lower address gives
    negative ones (no key is kNoKey, not a negative offset)."""
    inp = pool_inputs(kv, [2000, 700], [900, 40], 1, 16, topk=256, extra_topk=128,
                      extra_page=2, seed=14)
    main, extra = inp.pools
    a, b = main.k_cache, extra.k_cache
    n = a.numel() + b.numel() + 64
    buf = torch.empty(n, dtype=a.dtype, device="cuda")
    lo, hi = (b, a) if extra_first else (a, b)
    lo_v = buf[:lo.numel()].view(lo.shape)
    start = -(-(lo.numel()) // 64) * 64                   # 128-byte aligned
    hi_v = buf[start:start + hi.numel()].view(hi.shape)
    lo_v.copy_(lo)
    hi_v.copy_(hi)
    a2, b2 = (hi_v, lo_v) if extra_first else (lo_v, hi_v)
    assert (b2.data_ptr() < a2.data_ptr()) == extra_first
    check_pools(replace(inp, pools=[replace(main, k_cache=a2), replace(extra, k_cache=b2)]))


@pytest.mark.parametrize("kv", FORMATS)
def test_slot_past_the_extra_cache_gives_nan_and_flag(kv):
    a = api()
    inp = pool_inputs(kv, [500, 500], [300, 300], 1, 16, topk=128, extra_topk=64, seed=15,
                      invalid=0.0, topk_length=False)
    main, extra = inp.pools
    cap = extra.k_cache.shape[0] * extra.k_cache.shape[1]
    bad = extra.indices.clone()
    bad[1, 0, 3] = cap                                  # one past the extra cache's last slot
    a.device_error_flags().zero_()
    out, lse = run_pools(replace(inp, pools=[main, replace(extra, indices=bad)]))
    torch.cuda.synchronize()
    assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all()
    assert torch.isfinite(out[0]).all()
    with pytest.raises(InputError):
        a.check_device_errors()


@pytest.mark.parametrize("kv", FORMATS)
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(h_q=st.integers(1, 128), s_q=st.integers(1, 4),
       topk=st.sampled_from([1, 63, 65, 500, 2048]), extra_topk=st.sampled_from([1, 64, 130, 512]),
       page=st.sampled_from([1, 64, 256]), extra_page=st.sampled_from([1, 2, 64, 100]),
       seqlens=st.lists(st.integers(0, 3000), min_size=1, max_size=3),
       extra_len=st.integers(0, 3000), invalid=st.sampled_from([0.0, 0.3, 1.0]),
       topk_length=st.booleans(), sinks=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_two_pools_drawn(kv, h_q, s_q, topk, extra_topk, page, extra_page, seqlens, extra_len,
                         invalid, topk_length, sinks, seed):
    print(dict(kv=kv, h_q=h_q, s_q=s_q, topk=topk, extra_topk=extra_topk, page=page,
               extra_page=extra_page, seqlens=seqlens, extra_len=extra_len, invalid=invalid,
               topk_length=topk_length, sinks=sinks, seed=seed), flush=True)
    check_pools(pool_inputs(kv, seqlens, [extra_len] * len(seqlens), s_q, h_q, topk,
                            extra_topk, page, extra_page, seed, invalid, topk_length, sinks))


def test_two_pool_sched_meta_is_checked():
    """A FlashMLASchedMeta filled by a two-pool call is not reused by a one-pool call (nor
    another extra topk)."""
    inp = pool_inputs("bf16", [2000, 100], [500, 500], 1, 16, topk=256, extra_topk=128,
                      seed=16)
    sched, _ = api().get_mla_metadata()
    o1, l1 = run_pools(inp, sched)
    o2, l2 = run_pools(inp, sched)
    torch.cuda.synchronize()
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    with pytest.raises(InputError):
        run(replace(inp, pools=inp.pools[:1]), sched)
