"""Random workloads: paged caches poisoned exactly where no kernel may read, valid tables."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlagen.errors import InputError
from mlagen.problem import TORCH_DTYPES, make_inputs, make_paged_cache, positions
from mlagen.schedule.records import Problem


def read_slots(cache, table, lens):
    """[num_blocks, page] bool: the slots some sequence's tokens [0, len) live in."""
    page = cache.shape[1]
    read = torch.zeros(cache.shape[:2], dtype=torch.bool)
    for i, n in enumerate(lens):
        for t in range(n):
            read[int(table[i, t // page]), t % page] = True
    return read


@settings(max_examples=60, deadline=None)
@given(lens=st.lists(st.integers(0, 200), min_size=1, max_size=5),
       page=st.sampled_from([1, 7, 16, 64]), shuffle=st.booleans(),
       extra=st.integers(0, 3), seed=st.integers(0, 2 ** 16))
def test_nan_exactly_in_unread_slots(lens, page, shuffle, extra, seed):
    g = torch.Generator().manual_seed(seed)
    cache, table = make_paged_cache(lens, page, 8, torch.float32, g, shuffle=shuffle,
                                    extra_blocks=extra)
    read = read_slots(cache, table, lens)
    nan = torch.isnan(cache).any(dim=(-1, -2))
    assert torch.equal(nan, ~read)
    # a slot is either wholly NaN or wholly finite
    assert torch.equal(torch.isnan(cache).all(dim=(-1, -2)), nan)
    # table: in range everywhere (unused entries too), pages of a sequence are its own
    assert table.dtype == torch.int32
    assert int(table.min()) >= 0 and int(table.max()) < cache.shape[0]
    assert table.shape[1] >= max(max(1, math.ceil(n / page)) for n in lens)
    owned = [table[i, :max(1, math.ceil(n / page))].tolist() for i, n in enumerate(lens)]
    flat = [p for pages in owned for p in pages]
    assert len(flat) == len(set(flat))


def test_no_nan_without_nan_fill():
    g = torch.Generator().manual_seed(0)
    cache, _ = make_paged_cache([0, 5, 64], 16, 8, torch.float32, g, nan_fill=False)
    assert torch.isfinite(cache).all()


def test_empty_sequence_owns_one_all_nan_page():
    g = torch.Generator().manual_seed(0)
    cache, table = make_paged_cache([0, 3], 4, 8, torch.float32, g)
    assert torch.isnan(cache[int(table[0, 0])]).all()
    assert torch.isfinite(cache[int(table[1, 0]), :3]).all()
    assert torch.isnan(cache[int(table[1, 0]), 3:]).all()


def test_unshuffled_pages_are_in_order():
    g = torch.Generator().manual_seed(0)
    _, table = make_paged_cache([5, 9], 4, 8, torch.float32, g, shuffle=False)
    assert table[0, :2].tolist() == [0, 1] and table[1, :3].tolist() == [2, 3, 4]


def test_shuffled_pages_are_not_in_order():
    g = torch.Generator().manual_seed(0)
    _, table = make_paged_cache([640], 16, 8, torch.float32, g)
    assert table[0].tolist() != sorted(table[0].tolist())


def test_max_blocks_widens_the_table():
    g = torch.Generator().manual_seed(0)
    cache, table = make_paged_cache([5], 4, 8, torch.float32, g, max_blocks=10)
    assert table.shape == (1, 10)
    assert int(table.max()) < cache.shape[0]


@pytest.mark.parametrize("fused", [False, True])
def test_make_inputs_shapes_dtypes_and_poison(fused):
    p = Problem(heads=8, fused=fused, page_size=64, dtype="bf16")
    lens = [0, 1, 64, 65, 300]
    inp = make_inputs(p, 5, lens, s_q=2, seed=3)
    assert inp.k_cache.shape[1:] == (64, 1, 576) and inp.k_cache.dtype == torch.bfloat16
    assert inp.cache_seqlens.tolist() == lens and inp.cache_seqlens.dtype == torch.int32
    assert inp.batch == 5 and inp.s_q == 2 and inp.heads == 8 and inp.page_size == 64
    assert inp.dv == 512 and inp.causal
    assert torch.equal(torch.isnan(inp.k_cache).any(dim=(-1, -2)),
                       ~read_slots(inp.k_cache, inp.block_table, lens))
    if fused:
        assert inp.q is None and inp.q_lora.shape == (5, 2, 1536)
        w = inp.weights
        assert w.w_uq.shape == (1536, 8, 192) and w.w_uk.shape == (8, 128, 512)
        assert w.w_uv.shape == (8, 512, 128)
        assert inp.softmax_scale == pytest.approx(192 ** -0.5)
    else:
        assert inp.q.shape == (5, 2, 8, 576) and inp.q.dtype == torch.bfloat16
        assert inp.softmax_scale == pytest.approx(576 ** -0.5)
        assert torch.isfinite(inp.q.float()).all()


@pytest.mark.parametrize("fused", [False, True])
def test_noncontiguous_query(fused):
    p = Problem(heads=4, fused=fused)
    inp = make_inputs(p, 2, [3, 70], s_q=2, seed=1, q_noncontiguous=True)
    q = inp.q if not fused else inp.q_lora
    assert not q.is_contiguous()
    assert q.shape == ((2, 2, 4, 576) if not fused else (2, 2, 1536))
    assert inp.heads == 4 and inp.meta["q_noncontiguous"]


def test_same_seed_same_draw_and_other_seed_differs():
    p = Problem(heads=4)
    a, b = make_inputs(p, 2, [10, 20], seed=4), make_inputs(p, 2, [10, 20], seed=4)
    c = make_inputs(p, 2, [10, 20], seed=5)
    assert torch.equal(a.q, b.q) and torch.equal(a.block_table, b.block_table)
    assert torch.equal(torch.nan_to_num(a.k_cache), torch.nan_to_num(b.k_cache))
    assert not torch.equal(a.q, c.q)


def test_heads_default_to_the_problem():
    inp = make_inputs(Problem(heads=16), 1, [5])
    assert inp.heads == 16 and inp.meta["heads"] == 16


@pytest.mark.parametrize("kw", [dict(batch=2, seqlens=[1]), dict(batch=1, seqlens=[-1]),
                                dict(batch=1, seqlens=[3], s_q=0),
                                dict(batch=1, seqlens=[3], heads=0)])
def test_make_inputs_rejects_bad_arguments(kw):
    with pytest.raises(InputError):
        make_inputs(Problem(heads=4), **kw)


@pytest.mark.parametrize("kw", [dict(page_size=0), dict(seqlens=[3, -1]),
                                dict(extra_blocks=-1)])
def test_make_paged_cache_rejects_bad_arguments(kw):
    args = dict(seqlens=[3, 4], page_size=4, d=8, dtype=torch.float32,
                generator=torch.Generator().manual_seed(0))
    args.update(kw)
    with pytest.raises(InputError):
        make_paged_cache(**args)


def test_positions_are_the_last_tokens():
    pos = positions(torch.tensor([5, 1, 0], dtype=torch.int32), 3)
    assert pos.tolist() == [[2, 3, 4], [-2, -1, 0], [-3, -2, -1]]
    assert pos.dtype == torch.int64


def test_torch_dtypes():
    assert TORCH_DTYPES == {"bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_make_inputs_on_gpu_keeps_strides():
    inp = make_inputs(Problem(heads=4), 2, [3, 70], s_q=2, device="cuda", q_noncontiguous=True)
    assert inp.q.is_cuda and inp.k_cache.is_cuda and inp.block_table.is_cuda
    assert not inp.q.is_contiguous()
