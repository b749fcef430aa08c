"""Dense 8-bit caches (fp8_e4m3, fp8_ds_mla) in the 64-row wgmma kernel on a GPU: its
producer warpgroup gathers each block's keys by the block table into its own K stage and
converts them there (mla_wgmma.cuh, kGather).  Against mlagen.reference on the exactly
dequantized cache with the bf16 kernels' tolerances: h_q 1..128, s_q 1..8, lengths 0, 1 and
page edges, page sizes 1..256 (no TMA box: any page), shuffled page tables, NaN bytes in
every unused slot, the quantizer's edge tiles, one or per-sequence descales, fp16 queries on
e4m3; bad pages and descales made NaN with their flags; NaN bytes in used keys; the planted
dequantization faults caught."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlagen.errors import InputError
from mlagen.schedule.records import Schedule

from test_hopper_fp8_gpu import (EDGES, FORMATS, _spread_tiles, api, check,
                                 graph_replays_with_new_descale, inputs, run)

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

R64 = dict(target="hopper", mainloop="wgmma", block_kv=64, buffers=2, warps=8,
           rows_per_tile=64)


def r64(kv, dtype="bf16", fault="none"):
    return Schedule.build(**R64, kv_format=kv, dtype=dtype).with_fault(fault)


@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("batch,seqlens,s_q,h_q,page", [
    (4, [0, 1, 63, 64], 1, 128, 64),
    (3, [65, 4097, 1000], 1, 64, 16),
    (2, [127, 2000], 2, 128, 1),         # a key a page
    (3, [5, 300, 129], 1, 1, 256),
    (2, [1000, 1], 8, 16, 32),           # 128 rows, causal limits inside blocks
    (2, [700, 4097], 2, 65, 128),        # 130 rows: a last tile of 2
    (1, [1], 8, 32, 64),                 # rows that see no key
    (1, [20000], 1, 128, 64),            # split many ways
    (32, [4096] * 32, 1, 128, 64),
])
def test_cases(kv, batch, seqlens, s_q, h_q, page):
    for per_seq in (False, True):
        check(inputs(kv, batch, seqlens, s_q, h_q, page, per_seq=per_seq), r64(kv))


@pytest.mark.parametrize("kv", FORMATS)
def test_defaults_take_the_64_row_kernel_beyond_32_rows_and_on_small_pages(kv):
    """The API's default: 128 rows, and 16 rows on 16-token pages, run the 64-row kernel
    (a few-rows schedule on those pages is refused before launch)."""
    check(inputs(kv, 3, [100, 4097, 64], 1, 128))
    check(inputs(kv, 3, [100, 4097, 64], 1, 16, page=16))
    few = Schedule.build(**dict(R64, rows_per_tile=16, warps=4), kv_format=kv)
    with pytest.raises(InputError, match="multiple of 64"):
        run(inputs(kv, 2, [100, 70], 1, 16, page=16), few)


def test_fp16_query_with_an_e4m3_cache():
    check(inputs("fp8_e4m3", 3, [64, 1000, 1], 2, 64, page=32, dtype="fp16"),
          r64("fp8_e4m3", "fp16"))


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(kv=st.sampled_from(FORMATS + ("fp8_e4m3_fp16",)), batch=st.integers(1, 5),
       data=st.data(), s_q=st.integers(1, 8), h_q=st.sampled_from([1, 16, 33, 64, 65, 128]),
       page=st.sampled_from([1, 16, 32, 64, 128, 256]), causal=st.booleans(),
       seed=st.integers(0, 99), per_seq=st.booleans(), edges=st.booleans())
def test_hypothesis(kv, batch, data, s_q, h_q, page, causal, seed, per_seq, edges):
    seqlens = data.draw(st.lists(st.sampled_from(EDGES), min_size=batch, max_size=batch))
    dtype = "fp16" if kv.endswith("_fp16") else "bf16"
    kv = kv.removesuffix("_fp16")
    check(inputs(kv, batch, seqlens, s_q, h_q, page, seed, per_seq, edges, dtype),
          r64(kv, dtype), causal=causal)


@pytest.mark.parametrize("kv,col", [(kv, c) for kv in FORMATS for c in (0, 3, 130, 511)]
                         + [("fp8_e4m3", 512), ("fp8_e4m3", 575)])   # RoPE bytes
def test_nan_byte_in_a_used_slot_propagates(kv, col):
    inp = inputs(kv, 2, [100, 100], 1, 128, edges=False)
    blk = int(inp.block_table[0, 0])
    inp.k_cache.view(torch.uint8)[blk, 37, 0, col] = 0x7F
    out, _ = run(inp, r64(kv))
    torch.cuda.synchronize()
    assert torch.isnan(out[0]).all()
    assert torch.isfinite(out[1]).all()


@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("entry", [-1, "past"])
def test_bad_page_gives_nan_and_flag(kv, entry):
    """A block-table entry outside [0, num_blocks) in a sequence's range: its rows NaN and
    the bad-page flag set, never a read outside the cache; the other sequences untouched."""
    a = api()
    inp = inputs(kv, 3, [300, 300, 50], 1, 64, page=16, edges=False)
    a.check_device_errors()
    inp.block_table[1, 5] = -1 if entry == -1 else inp.k_cache.shape[0] + 7
    out, lse = run(inp, r64(kv))
    torch.cuda.synchronize()
    assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all()
    assert torch.isfinite(out[0]).all() and torch.isfinite(out[2]).all()
    with pytest.raises(InputError, match="block"):
        a.check_device_errors()


def test_bad_descale_gives_nan_and_flag_8():
    a = api()
    inp = inputs("fp8_e4m3", 3, [100, 70, 5], 1, 128, per_seq=True)
    a.check_device_errors()
    inp.k_descale[1] = float("inf")
    out, _ = run(inp, r64("fp8_e4m3"))
    torch.cuda.synchronize()
    assert torch.isnan(out[1]).all() and torch.isfinite(out[0]).all()
    with pytest.raises(InputError, match="descale"):
        a.check_device_errors()


@pytest.mark.parametrize("kv", FORMATS)
def test_descale_q_multiplies_the_scores(kv):
    inp = inputs(kv, 2, [100, 70], 1, 128)
    ref, _ = run(inp, r64(kv))
    half, half_lse = run(inp, r64(kv), descale_q=torch.full((1,), 0.5, device="cuda"))
    inp.softmax_scale *= 0.5
    want, want_lse = run(inp, r64(kv))
    torch.cuda.synchronize()
    assert torch.allclose(half.float(), want.float(), atol=2e-3, rtol=1e-2)
    assert torch.allclose(half_lse, want_lse, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(half.float(), ref.float(), atol=2e-3, rtol=1e-2)


@pytest.mark.parametrize("kv,fault", [("fp8_ds_mla", "kv_scale_wrong_tile"),
                                      ("fp8_ds_mla", "kv_scale_twice"),
                                      ("fp8_e4m3", "kv_scale_twice"),
                                      ("fp8_e4m3", "descale_not_in_output"),
                                      ("fp8_e4m3", "causal_off_by_one"),
                                      ("fp8_ds_mla", "wrong_scale")])
def test_planted_faults_are_caught(kv, fault):
    inp = inputs(kv, 3, [100, 1000, 64], 2, 64, page=32, edges=False, per_seq=True)
    if kv == "fp8_ds_mla":
        inp = _spread_tiles(inp)
    check(inp, r64(kv))                      # the sound kernel passes
    with pytest.raises(AssertionError):
        check(inp, r64(kv, fault=fault))


def test_graph_capture_replays_with_new_descale():
    graph_replays_with_new_descale(inputs("fp8_e4m3", 4, [100, 4097, 64, 1], 1, 128, page=16,
                                          per_seq=True))
