"""Token-sparse decode with d_qk 512 (a 448-value latent + 64 RoPE values, all 512 of them
the values: DeepSeek-V4's attention, FlashMLA's MODEL1) through the Hopper API on a GPU:
bf16 caches and the page-major fp8_ue8m0_paged cache (per page, data rows then UE8M0 scale
rows), one pool and two (a window pool in pages of 256 with topk 128, a compressed pool in
pages of 64 or 2 with topk 512 / 1024), sinks, against mlagen.reference.sparse_attention:
fixed cases, hypothesis-drawn shapes, page sizes, lengths (0, 1, page edges), invalid and
repeated entries, NaN in every slot no entry names, a running max that moves late, a slot
past the cache.  The 64-row kernel (its producer warpgroup converts fp8_ue8m0_paged in its
own K stages and a side buffer) by explicit schedules beside the default tiles."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlagen import kvformat
from mlagen.errors import InputError
from mlagen.problem import make_sparse_inputs
from mlagen.reference import sparse_attention
from mlagen.schedule.records import Problem, Schedule

from hopper_util import assert_close

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

FORMATS = ("bf16", "fp8_ue8m0_paged")
RANK = 448


def api():
    from mlagen.backends.hopper import api as a
    return a


def make(kv, seqlens, s_q, h_q, topk, page, extra=None, seed=0, invalid=0.2, repeats=0.0,
         topk_length=False, sinks=True, lengths=None):
    """One or two pools (extra: (extra_seqlens, extra_topk, extra_page)) in one format, NaN
    in every slot no valid entry names, on the GPU."""
    from mlagen.verify.sparse import nan_unnamed
    xs, xtopk, xpage = extra if extra else (None, 0, 0)
    prob = Problem(kv_lora_rank=RANK, rope_dim=64, v_dim=512, page_size=page, dtype="bf16",
                   max_s_q=s_q, causal=False, kv_format="" if kv == "bf16" else kv,
                   extra_kv_format="" if kv == "bf16" or not extra else kv,
                   attention="sparse", topk=topk, extra_topk=xtopk, extra_page_size=xpage,
                   sinks=sinks)
    inp = make_sparse_inputs(prob, len(seqlens), seqlens, s_q=s_q, heads=h_q, seed=seed,
                             extra_seqlens=xs, invalid=invalid, repeats=repeats,
                             topk_length=topk_length or lengths is not None)
    if lengths is not None:
        for pool, tl in zip(inp.pools, lengths):
            pool.topk_length[:] = torch.tensor(tl, dtype=torch.int32)
    inp = nan_unnamed(inp, RANK)
    mv = lambda t: None if t is None else t.cuda()   # noqa: E731
    return replace(inp, q=inp.q.cuda(), attn_sink=mv(inp.attn_sink),
                   pools=[replace(p, k_cache=strided_cuda(p.k_cache), indices=p.indices.cuda(),
                                  topk_length=mv(p.topk_length)) for p in inp.pools])


def strided_cuda(t):
    """t on the GPU with its strides (.cuda() makes a padded fp8_ue8m0_paged view
    contiguous: odd page sizes then lose the 16-byte page alignment the gather needs)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda").copy_(t)


def wide(kv, pools):
    """A 64-row schedule for d_qk 512 (the default takes it only where wide_rows says)."""
    fmt = "" if kv == "bf16" else kv
    two = dict(extra_topk=512, extra_page_size=64, extra_kv_format=fmt) if pools == 2 else {}
    return Schedule.build(target="hopper", dtype="bf16", kv_format=fmt, kv_lora_rank=RANK,
                          rope_dim=64, v_dim=512, attention="sparse", topk=128, causal=False,
                          rows_per_tile=64, block_kv=64, buffers=2, warps=8, mainloop="wgmma",
                          **two)


def run(inp, sched=None, schedule=None):
    a = api()
    main = inp.pools[0]
    x = inp.pools[1] if len(inp.pools) == 2 else None
    if sched is None:
        sched, _ = a.get_mla_metadata()
    return a.flash_mla_with_kvcache(
        inp.q, main.k_cache, None, None, 512, sched, softmax_scale=inp.softmax_scale,
        is_fp8_kvcache=main.k_cache.dtype != torch.bfloat16, indices=main.indices,
        attn_sink=inp.attn_sink, topk_length=main.topk_length, schedule=schedule,
        extra_k_cache=None if x is None else x.k_cache,
        extra_indices_in_kvcache=None if x is None else x.indices,
        extra_topk_length=None if x is None else x.topk_length)


def check(inp, sched=None, schedule=None):
    """out within abs max(8e-4, max|V| / 256) OR rel 2.01/128 with cos-diff < 5e-6 of the
    float64 reference (P rounded to bf16 in the kernel), lse within 1e-6 OR 8.01/65536; NaN
    and inf masks equal."""
    out, lse = run(inp, sched, schedule)
    torch.cuda.synchronize()
    assert out.shape == (*inp.q.shape[:3], 512)
    ref_o, ref_l = sparse_attention(inp.q, inp.pools, softmax_scale=inp.softmax_scale,
                                    attn_sink=inp.attn_sink, dtype=torch.float64)
    vmax = 0.0
    for pool in inp.pools:
        vals = (kvformat.dequantize(pool.k_cache, pool.kv_format, None, rank=RANK)
                if pool.k_cache.dtype != torch.bfloat16 else pool.k_cache.double())
        vmax = max(vmax, float(torch.nan_to_num(vals, 0.0, 0.0, 0.0).abs().max()))
    assert_close(out.float(), ref_o.to(out.dtype).float(), "out", max(8e-4, vmax / 256),
                 2.01 / 128, 5e-6)
    assert_close(lse, ref_l.float(), "lse", 1e-6, 8.01 / 65536)
    return out, lse


@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("seqlens,s_q,h_q,topk,page", [
    ([100, 3000], 1, 16, 64, 64),
    ([5000, 70], 2, 64, 128, 256),       # V4's window pool: pages of 256, topk 128
    ([300], 1, 1, 1, 1),                 # topk 1, page 1
    ([1000, 1000, 17], 3, 20, 100, 16),  # topk not a multiple of 64
    ([64, 0], 2, 128, 130, 32),          # a sequence with no key: all-invalid rows
])
@pytest.mark.parametrize("rows", [0, 64])
def test_one_pool(kv, seqlens, s_q, h_q, topk, page, rows):
    check(make(kv, seqlens, s_q, h_q, topk, page, seed=1, repeats=0.1),
          schedule=wide(kv, 1) if rows else None)


@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("h_q,s_q,extra", [
    (64, 1, ([3000, 0, 700], 512, 64)),      # MODEL1's shapes: window 128 / 256, 512 / 64
    (128, 2, ([3000, 0, 700], 1024, 2)),
    (16, 2, ([3000, 0, 700], 512, 64)),      # a TP shard of V4-Flash's 64 heads
    (8, 1, ([65, 64, 63], 64, 64)),          # lengths at a page edge
])
@pytest.mark.parametrize("rows", [0, 64])
def test_two_pools(kv, h_q, s_q, extra, rows):
    inp = make(kv, [5000, 900, 0], s_q, h_q, 128, 256, extra=extra, seed=11)
    out, lse = check(inp, schedule=wide(kv, 2) if rows else None)
    assert torch.isfinite(lse[0]).all()


@pytest.mark.parametrize("kv", FORMATS)
def test_lengths_zero_and_past_topk(kv):
    inp = make(kv, [3000] * 4, 2, 16, 300, 64, extra=([800] * 4, 130, 16), seed=12,
               lengths=([0, 300, 5000, 0], [0, 0, 1, 130]))
    out, lse = check(inp)
    assert torch.isinf(lse[0]).all() and (out[0] == 0).all()    # no key in either pool


@pytest.mark.parametrize("kv", FORMATS)
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(h_q=st.integers(1, 128), s_q=st.integers(1, 4),
       topk=st.sampled_from([1, 63, 64, 65, 128, 500]),
       extra_topk=st.sampled_from([0, 1, 64, 130, 512, 1024]),
       page=st.sampled_from([1, 64, 256]), extra_page=st.sampled_from([1, 2, 64, 100]),
       seqlens=st.lists(st.integers(0, 3000), min_size=1, max_size=3),
       extra_len=st.integers(0, 3000), invalid=st.sampled_from([0.0, 0.3, 1.0]),
       repeats=st.sampled_from([0.0, 0.2]), topk_length=st.booleans(), sinks=st.booleans(),
       rows=st.sampled_from([0, 64]), seed=st.integers(0, 2 ** 16))
def test_drawn(kv, h_q, s_q, topk, extra_topk, page, extra_page, seqlens, extra_len, invalid,
               repeats, topk_length, sinks, rows, seed):
    print(dict(kv=kv, h_q=h_q, s_q=s_q, topk=topk, extra_topk=extra_topk, page=page,
               extra_page=extra_page, seqlens=seqlens, extra_len=extra_len, invalid=invalid,
               repeats=repeats, topk_length=topk_length, sinks=sinks, rows=rows, seed=seed),
          flush=True)
    extra = ([extra_len] * len(seqlens), extra_topk, extra_page) if extra_topk else None
    check(make(kv, seqlens, s_q, h_q, topk, page, extra, seed, invalid, repeats, topk_length,
               sinks), schedule=wide(kv, 2 if extra else 1) if rows else None)


@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("rows", [0, 64])
def test_running_max_moves_late(kv, rows):
    """Keys of rising scores through the first RoPE column (448, stored in bf16 by both
    formats) and a dominant key at the last valid entry of row (0, 0)."""
    inp = make(kv, [4000, 3000], 2, 64, 500, 64, extra=([2000, 2000], 512, 64), seed=4,
               invalid=0.1, sinks=False)
    q = inp.q.clone()
    q[..., RANK] = 1.0
    pools = []
    for n, pool in enumerate(inp.pools):
        vals = (kvformat.dequantize(pool.k_cache, pool.kv_format, None, rank=RANK)
                if kv != "bf16" else pool.k_cache.clone())
        flat = vals.view(-1, 512)
        idx = pool.indices.long()
        valid = idx[idx >= 0].unique()
        flat[valid, RANK] = (torch.arange(valid.numel(), device="cuda") * 0.05).to(flat.dtype)
        if n == 1:
            last = int(idx[0, 0][idx[0, 0] >= 0][-1])
            flat[last, RANK] = 3000.0
        cache = vals if kv == "bf16" else kvformat.quantize(vals.float(), kv, rank=RANK)
        pools.append(replace(pool, k_cache=cache))
    check(replace(inp, q=q, pools=pools), schedule=wide(kv, 2) if rows else None)


def test_contiguous_odd_pages_are_refused():
    """A fp8_ue8m0_paged cache copied contiguous (.cuda() of the padded view) with pages of
    an odd size: its pages no longer start on 16 bytes, refused in one line."""
    inp = make("fp8_ue8m0_paged", [300], 1, 16, 64, 1, seed=7)
    pool = inp.pools[0]
    flat = replace(pool, k_cache=pool.k_cache.contiguous())
    with pytest.raises(InputError, match="16-byte page boundaries"):
        run(replace(inp, pools=[flat]))


@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("rows", [0, 64])
def test_slot_past_the_cache_gives_nan_and_flag(kv, rows):
    a = api()
    inp = make(kv, [500, 500], 1, 16, 128, 64, seed=5, invalid=0.0)
    pool = inp.pools[0]
    bad = pool.indices.clone()
    bad[1, 0, 3] = pool.k_cache.shape[0] * pool.k_cache.shape[1]   # one past the last slot
    a.device_error_flags().zero_()
    out, lse = run(replace(inp, pools=[replace(pool, indices=bad)]),
                   schedule=wide(kv, 1) if rows else None)
    torch.cuda.synchronize()
    assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all()
    assert torch.isfinite(out[0]).all()
    with pytest.raises(InputError):
        a.check_device_errors()


def test_graph_capture():
    inp = make("fp8_ue8m0_paged", [3000, 900], 1, 64, 128, 256, extra=([3000, 100], 512, 64),
               seed=6)
    sched, _ = api().get_mla_metadata()
    out0, lse0 = run(inp, sched)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = run(inp, sched)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, out0) and torch.equal(lse, lse0)
