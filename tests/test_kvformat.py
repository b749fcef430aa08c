"""KV-cache formats (mlagen.kvformat): layouts, the quantizer's rounding, the writer, and the
reference on quantized caches."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from mlagen import kvformat
from mlagen.errors import InputError
from mlagen.problem import make_inputs
from mlagen.reference import attention, run
from mlagen.schedule.records import Problem


def _pattern(d: int = 576, tile: int = 128) -> torch.Tensor:
    """A version-independent input of d values a token (the latent first, 64 rope values): a
    smooth pattern whose token magnitudes span 2^-20..2^10, with the quantizer's edge tiles
    of `tile` values (all zero, amax exactly 448 * 2^-7, a scale that rounds up, amax under
    the 1e-4 clamp, values of exactly 448)."""
    n, page = 3, 64
    i = torch.arange(n * page * d, dtype=torch.float64).reshape(n, page, 1, d)
    tok = torch.arange(n * page, dtype=torch.float64).reshape(n, page, 1, 1)
    x = (torch.sin(i * 0.7071) * torch.exp2((tok % 31) - 20)).to(torch.bfloat16)
    x[0, 1, 0, :tile] = 0
    t1 = x[0, 2, 0, tile:2 * tile]
    x[0, 2, 0, tile:2 * tile] = t1 / t1.abs().max() * 3.5
    x[0, 2, 0, tile] = 3.5
    x[0, 3, 0, 2 * tile:3 * tile] = 3.5 * 1.01
    x[0, 4, 0, :d - 64] = 1e-6
    x[1, 5, 0, :] = 448.0
    return x


# FlashMLA's tests/quant.py (deepseek-ai/FlashMLA 9241ae3), quantize_k_cache(_pattern(),
# V32_FP8Sparse), as bytes: its digest, measured once by running that file on this input
FLASHMLA_DS_MLA_SHA256 = "76e71b36f272977140aee165864d0b3c12b5732028a91ca29da6448d499f336d"


def test_ds_mla_bytes_equal_flashmla_quantizer():
    got = kvformat.quantize(_pattern(), "fp8_ds_mla").contiguous().view(torch.uint8)
    assert tuple(got.shape) == (3, 64, 1, 656)
    assert hashlib.sha256(got.numpy().tobytes()).hexdigest() == FLASHMLA_DS_MLA_SHA256


def _page_bytes(cache: torch.Tensor) -> torch.Tensor:
    """Each page's bytes [blocks, page * width], the pad byte of every scale row zeroed
    (FlashMLA's quantizer leaves it uninitialised)."""
    b, page, _, w = cache.shape
    raw = cache.view(torch.uint8)
    out = torch.as_strided(raw, (b, page * w), (raw.stride(0), 1), raw.storage_offset()).clone()
    out[:, page * 576 + 7::8] = 0
    return out


# the same for its page-major layout: quantize_k_cache(_pattern(512, 64), MODEL1_FP8Sparse)
FLASHMLA_PAGED_SHA256 = "56127da324d76116410c1594771357c4e4ee32aced377eb3490a521922acdd62"


def test_paged_bytes_equal_flashmla_quantizer():
    got = kvformat.quantize(_pattern(512, 64), "fp8_ue8m0_paged", rank=448)
    assert tuple(got.shape) == (3, 64, 1, 584)
    assert got.stride(0) == 37440                          # the page padded to 65 x 576 bytes
    assert hashlib.sha256(_page_bytes(got).numpy().tobytes()).hexdigest() == \
        FLASHMLA_PAGED_SHA256


def test_paged_writer_and_reference():
    x = _pattern(512, 64)
    whole = kvformat.quantize(x, "fp8_ue8m0_paged", rank=448)
    # the writer, token by token in a shuffled order, makes the same pages
    cache = torch.zeros_like(whole.view(torch.uint8)).view(kvformat.FP8)
    order = torch.randperm(3 * 64, generator=torch.Generator().manual_seed(0))
    for part in order.split(50):
        kvformat.write(cache, part, x.reshape(-1, 512)[part], "fp8_ue8m0_paged", rank=448)
    assert torch.equal(_page_bytes(cache), _page_bytes(whole))
    # exact dequantization, and the reference reads the page-major cache as its values
    vals = kvformat.dequantize(whole, "fp8_ue8m0_paged", rank=448)
    assert (vals - x.float()).abs().amax() <= x.float().abs().amax() * 2 ** -3
    q = torch.randn(1, 2, 8, 512, generator=torch.Generator().manual_seed(1))
    table = torch.tensor([[2, 0, 1]], dtype=torch.int32)
    lens = torch.tensor([150], dtype=torch.int32)
    got = attention(q, whole, table, lens, dv=512, dtype=torch.float64)
    want = attention(q, vals, table, lens, dv=512, dtype=torch.float64)
    torch.testing.assert_close(got[0], want[0], rtol=1e-12, atol=1e-12)


def test_ds_mla_layout_and_edges():
    x = _pattern()
    raw = kvformat.quantize(x, "fp8_ds_mla").view(torch.uint8)
    scales = raw[..., 512:528].contiguous().view(torch.float32)
    # every scale a power of two, >= the clamp's, and covering its tile's amax
    m, e = torch.frexp(scales)
    assert bool((m == 0.5).all())
    assert float(scales.min()) == 2.0 ** -13               # 2^ceil(log2(1e-4))
    assert float(scales[0, 2, 0, 1]) == 2.0 ** -7          # amax 3.5 = 448 * 2^-7 exactly
    assert float(scales[0, 3, 0, 2]) == 2.0 ** -6          # amax just above: rounds up
    lat = raw[..., :512].view(kvformat.FP8).float()
    assert float(lat[0, 2, 0, 128]) == 448.0
    assert bool((lat[0, 1, 0, :128] == 0).all())
    # the rope part is the bf16 values, untouched
    rope = raw[..., 528:].contiguous().view(torch.bfloat16)
    assert torch.equal(rope, x[..., 512:])
    # dequantization is exact: float32 holds e4m3 * a power of two without rounding
    y = kvformat.dequantize(raw.view(kvformat.FP8), "fp8_ds_mla")
    exact = (lat.double().unflatten(-1, (4, 128)) * scales.double()[..., None]).flatten(-2)
    assert torch.equal(y[..., :512].double(), exact)
    rel = (y - x.float()).abs().amax() / x.float().abs().amax()
    assert rel < 2 ** -3                                   # e4m3 keeps 3 mantissa bits


def test_e4m3_saturates_and_keeps_nan():
    x = torch.tensor([[1.0, -1000.0, 1000.0, float("nan")] + [0.5] * 572])
    q = kvformat.quantize(x, "fp8_e4m3", torch.tensor([1.0]))
    v = q.float()
    assert v[0, 1] == -448 and v[0, 2] == 448 and math.isnan(v[0, 3])
    back = kvformat.dequantize(q, "fp8_e4m3", torch.tensor([0.25]))
    assert back[0, 0] == 0.25 and back[0, 4] == 0.125


def test_detect_and_widths():
    assert kvformat.get("fp8_ds_mla").width() == 656
    assert kvformat.get("fp8_ds_mla").token_bytes() == 656
    assert kvformat.get("fp8_e4m3").token_bytes() == 576
    assert kvformat.get("bf16").token_bytes() == 1152
    assert kvformat.detect(torch.empty(1, 64, 1, 576, dtype=torch.bfloat16)) == "bf16"
    assert kvformat.detect(torch.empty(1, 64, 1, 576, dtype=kvformat.FP8)) == "fp8_e4m3"
    assert kvformat.detect(torch.empty(1, 64, 1, 656, dtype=torch.uint8)) == "fp8_ds_mla"
    with pytest.raises(InputError, match="no KV format"):
        kvformat.detect(torch.empty(1, 64, 1, 600, dtype=kvformat.FP8))
    with pytest.raises(InputError, match="not one of"):
        kvformat.get("fp4")


@pytest.mark.parametrize("descale, msg", [
    (None, "needs k_descale"),
    (torch.ones(3), r"fp32 \[1\] or \[2\]"),
    (torch.ones(1, dtype=torch.float64), r"fp32 \[1\] or \[2\]"),
    (torch.tensor([0.0]), "finite and > 0"),
    (torch.tensor([float("inf"), 1.0]), "finite and > 0"),
])
def test_bad_descale(descale, msg):
    with pytest.raises(InputError, match=msg):
        kvformat.check_descale(descale, "fp8_e4m3", 2)


def test_descale_refused_for_ds_mla():
    with pytest.raises(InputError, match="takes none"):
        kvformat.check_descale(torch.ones(1), "fp8_ds_mla", 2)


@pytest.mark.parametrize("name", ["bf16", "fp8_e4m3", "fp8_ds_mla"])
def test_writer_stores_what_quantize_makes(name):
    g = torch.Generator().manual_seed(3)
    width = kvformat.get(name).width()
    dtype = torch.bfloat16 if name == "bf16" else kvformat.FP8
    cache = torch.zeros(4, 16, 1, width, dtype=torch.uint8).view(dtype) if name != "bf16" \
        else torch.zeros(4, 16, 1, width, dtype=dtype)
    before = cache.clone()
    kv = torch.randn(5, 576, generator=g).to(torch.bfloat16)
    slots = torch.tensor([17, 3, -1, 63, 40])
    descale = torch.tensor([0.01]) if name == "fp8_e4m3" else None
    kvformat.write(cache, slots, kv, name, descale)
    want = kvformat.quantize(kv, name, descale)
    as_bytes = (lambda t: t.view(torch.uint8)) if name != "bf16" else (lambda t: t)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(as_bytes(cache[s // 16, s % 16, 0]), as_bytes(want[i]))
    # nothing else was written (the skipped token, the other slots)
    written = torch.zeros(64, dtype=torch.bool)
    written[[17, 3, 63, 40]] = True
    rest = as_bytes(cache).reshape(64, -1)[~written]
    assert torch.equal(rest, as_bytes(before).reshape(64, -1)[~written])


def test_writer_refuses_bad_input():
    cache = torch.zeros(2, 16, 1, 656, dtype=torch.uint8)
    kv = torch.zeros(2, 576)
    with pytest.raises(InputError, match="past the cache"):
        kvformat.write(cache, torch.tensor([0, 32]), kv, "fp8_ds_mla")
    with pytest.raises(InputError, match=r"\[\.\.\., 576\]"):
        kvformat.write(cache, torch.tensor([0, 1]), kv, "fp8_e4m3", torch.ones(1))
    with pytest.raises(InputError, match="needs one descale"):
        kvformat.write(torch.zeros(2, 16, 1, 576, dtype=kvformat.FP8), torch.tensor([0, 1]),
                       kv, "fp8_e4m3")


@pytest.mark.parametrize("name, per_seq", [("fp8_e4m3", False), ("fp8_e4m3", True),
                                           ("fp8_ds_mla", False)])
def test_reference_reads_the_dequantized_cache(name, per_seq):
    p = Problem(heads=16, page_size=64, kv_format=name)
    inp = make_inputs(p, 3, [0, 1, 200], s_q=2, seed=5, kv_edges=True, descale_per_seq=per_seq)
    assert inp.kv == name and inp.k_cache.dtype == kvformat.FP8
    got = run(inp, torch.float64)
    # the same attention on the cache dequantized by hand (per sequence for a [b] descale)
    vals = kvformat.dequantize(inp.k_cache, name, None, 512, torch.float64)
    outs, lses = [], []
    for i in range(3):
        v = vals if inp.k_descale is None else vals * inp.k_descale[i if per_seq else 0].double()
        o, lse = attention(inp.q[i:i + 1], v, inp.block_table[i:i + 1],
                           inp.cache_seqlens[i:i + 1], softmax_scale=inp.softmax_scale,
                           dtype=torch.float64)
        outs.append(o)
        lses.append(lse)
    torch.testing.assert_close(got.out, torch.cat(outs), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.lse, torch.cat(lses), rtol=1e-12, atol=1e-12)
    assert not bool(torch.isnan(got.out).any())           # NaN bytes in unused slots unread
    assert bool(torch.isinf(got.lse[0]).all())            # the empty sequence


def test_nan_in_a_used_fp8_slot_propagates():
    p = Problem(heads=4, page_size=64, kv_format="fp8_ds_mla")
    inp = make_inputs(p, 1, [70], seed=2)
    page = int(inp.block_table[0, 1])
    inp.k_cache.view(torch.uint8)[page, 3, 0, 10] = 0x7F  # e4m3 NaN in token 67
    assert bool(torch.isnan(run(inp, torch.float64).out).all())


def test_quantized_problem_draws_nan_in_unused_slots():
    p = Problem(heads=4, page_size=64, kv_format="fp8_e4m3")
    inp = make_inputs(p, 2, [10, 64], seed=1)
    raw = kvformat.dequantize(inp.k_cache, "fp8_e4m3")
    page = int(inp.block_table[0, 0])
    assert bool(torch.isnan(raw[page, 10:]).all()) and not bool(torch.isnan(raw[page, :10]).any())
