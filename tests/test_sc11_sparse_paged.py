"""fp8_ue8m0_paged pools on SC11's sparse path (schedules/sc11_sparse_v4_fp8.toml): a row
with one key returns that key's kvformat.dequantize values bit for bit (scales of many
exponents), the emulator matches the reference, each token is gathered as two pieces of
its page (data row, scale row), and the rules refuse what the path cannot read."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

import mlagen
from mlagen import formats, kvformat
from mlagen.backends.sc11 import tracecheck
from mlagen.backends.sc11.resources import sc11_heads_per_core
from mlagen.backends.sc11.trace import Engine, Op
from mlagen.paths import SCHEDULES_DIR
from mlagen.problem import MlaOutputs, make_sparse_inputs
from mlagen.reference import sparse_attention
from mlagen.schedule import load
from mlagen.schedule.rules import violations
from mlagen.schedule.rules import plan_of
from mlagen.verify.compare import compare

NAME = "sc11_sparse_v4_fp8"


@functools.lru_cache(maxsize=None)
def schedule():
    return load(SCHEDULES_DIR / f"{NAME}.toml")


@functools.lru_cache(maxsize=None)
def runner():
    return mlagen.runner(schedule())


def inputs(seqlens=(300, 70), seed=0, **kw):
    s = schedule()
    return make_sparse_inputs(s.problem, len(seqlens), list(seqlens), s_q=2,
                              heads=s.heads_per_device, seed=seed, **kw)


def _spread_scales(pool, g):
    """Every scale byte of the pool redrawn over exponents 2^-30 .. 2^20 (a group's scale
    differs from its neighbours' and the next token's)."""
    _, scales = kvformat.paged_rows(pool.k_cache, schedule().problem.kv_lora_rank)
    scales[..., :-1] = torch.randint(97, 148, scales[..., :-1].shape, generator=g,
                                     dtype=torch.int32).to(torch.uint8)


def test_a_one_key_row_is_that_keys_dequantized_values_exactly():
    p = schedule().problem
    g = torch.Generator().manual_seed(1)
    inp = inputs()
    for pool in inp.pools:
        _spread_scales(pool, g)
    # row (b, s): one valid entry, in the main pool for b = 0, in the extra pool for b = 1
    want = []
    for b in range(2):
        for s in range(2):
            pool = inp.pools[b]
            at = int((pool.indices[b, s] >= 0).nonzero()[-1])     # the row's last valid entry
            keep = int(pool.indices[b, s, at])
            for other in inp.pools:
                other.indices[b, s].fill_(-1)
            pool.indices[b, s, at] = keep
            vals = kvformat.dequantize(pool.k_cache, p.kv, None, p.kv_lora_rank)
            page = pool.k_cache.shape[1]
            want.append(vals[keep // page, keep % page, 0, :p.dv])
    for pool in inp.pools:
        pool.topk_length = None
    sink = torch.full_like(inp.attn_sink, -math.inf)   # a factor of exactly 1
    inp = dataclasses.replace(inp, attn_sink=sink)
    got = runner()(inp, scheme="seq").out
    for i, w in enumerate(want):
        b, s = divmod(i, 2)
        exp = w.to(torch.bfloat16).expand(got.shape[2], -1)
        assert torch.equal(w.to(torch.bfloat16).float(), w), "a dequantized value is bf16"
        assert torch.equal(got[b, s], exp), (b, s)


@pytest.mark.parametrize("draw,scheme", [
    (dict(invalid=0.3, repeats=0.3, topk_length=True), "batch_seq"),
    (dict(infinite_sinks=True, invalid=0.1), "heads")])
def test_matches_the_sparse_reference(draw, scheme):
    inp = inputs(seed=3, **draw)
    g = torch.Generator().manual_seed(2)
    _spread_scales(inp.pools[0], g)
    got = runner()(inp, scheme=scheme)
    out, lse = sparse_attention(inp.q, inp.pools, dv=inp.dv, softmax_scale=inp.softmax_scale,
                                attn_sink=inp.attn_sink, dtype=torch.float64)
    cmp = compare(got, MlaOutputs(out, lse), schedule().problem.dtype)
    assert cmp.ok, cmp.summary()


@pytest.mark.parametrize("gather", ("runs", "token"))
def test_a_token_is_gathered_as_two_pieces_of_its_page(gather):
    """A token is two pieces of its page (data row, scale row); "token": two descriptors a
    token, "runs": two a run of adjacent slots, each moving every token's piece."""
    from test_sc11_sparse import _runs

    s = schedule().replace(gather=gather)
    p = s.problem
    inp = inputs(invalid=0.4, topk_length=True)
    n = 0
    for pool in inp.pools:
        keep = pool.indices.long() >= 0
        keep &= torch.arange(keep.shape[-1])[None, None] < pool.topk_length.long()[:, None, None]
        n += int(keep.sum())
    kvb = formats.get(p.kv).token_bytes(p.kv_lora_rank, p.rope_dim)
    assert kvb == 584
    run = mlagen.runner(s)
    for scheme in ("heads", "batch_seq", "batch"):
        tr = run(inp, scheme=scheme).extra["trace"]
        sdma = tr[(tr["engine"] == Engine.SDMA) & (tr["op"] == Op.DMA)]
        readers = -(-s.heads_per_device // sc11_heads_per_core(s)) if scheme == "heads" else 1
        if gather == "token" or scheme == "batch":
            runs = n if gather == "token" else _runs(inp, s, s.mapping.seq_tile)
            assert int(sdma["m"].sum()) == 2 * runs * readers, scheme   # data + scale rows
        assert int(sdma["aux"].sum()) == 2 * n * readers, scheme   # a row a piece in L2
        assert int(sdma["bytes"].sum()) == n * readers * kvb, scheme
        assert tracecheck.check(tr, s.mapping.buffers, p.d) == [], scheme


def _problems(s, **kw):
    return [v for v in violations(dataclasses.replace(s, problem=dataclasses.replace(
        s.problem, **kw)), plan_of(s).target) if v[1] in ("kv_format", "extra_kv_format")]


def test_the_rules_take_the_paged_format_only_where_it_fits():
    s = schedule()
    assert _problems(s) == []
    assert "sparse path only" in _problems(s, attention="dense", topk=0, extra_topk=0,
                                           sinks=False, extra_kv_format="")[0][2]
    assert "needs dtype = \"bf16\"" in _problems(s, dtype="fp16")[0][2]
    assert "kv_lora_rank = 448 and rope_dim = 64" in \
        _problems(s, kv_lora_rank=512, v_dim=512)[0][2]
    assert "differs from kv_format" in _problems(s, extra_kv_format="bf16")[0][2]
