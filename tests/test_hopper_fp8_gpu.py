"""8-bit KV caches (fp8_e4m3, fp8_ds_mla) through the Hopper API on a GPU, "dequantize"
mode (the few-rows wgmma kernel's converter warpgroup): against mlagen.reference on the
exactly dequantized cache with the bf16 kernels' tolerances, over h_q 1..128, s_q 1..8,
lengths 0, 1 and page edges, shuffled page tables, NaN bytes in every unused slot, the
quantizer's edge tiles (amax exactly 448 times a power of two, all-zero tiles, scales that
round up), one or per-sequence descales; the API's refusals before launch; graph capture;
and the planted dequantization faults being caught."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlagen import kvformat
from mlagen.errors import InputError
from mlagen.problem import make_inputs
from mlagen.reference import attention
from mlagen.schedule.records import Problem, Schedule

from hopper_util import assert_close

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

FORMATS = ("fp8_e4m3", "fp8_ds_mla")
EDGES = (0, 1, 2, 63, 64, 65, 127, 128, 129, 1000, 4097)
ROWS = dict(target="hopper", mainloop="wgmma", block_kv=64, buffers=2, warps=4)


def api():
    from mlagen.backends.hopper import api as a
    return a


def schedule(kv, rows=16, fault="none", **kw):
    return Schedule.build(**ROWS, rows_per_tile=rows, kv_format=kv, **kw).with_fault(fault)


def inputs(kv, batch, seqlens, s_q, h_q, page=64, seed=0, per_seq=False, edges=True,
           dtype="bf16"):
    prob = Problem(page_size=page, dtype=dtype, max_s_q=s_q, kv_format=kv)
    return make_inputs(prob, batch, seqlens, s_q=s_q, heads=h_q, seed=seed, device="cuda",
                       kv_edges=edges, descale_per_seq=per_seq)


def run(inp, sched=None, causal=True, **kw):
    a = api()
    s_q, h_q = inp.q.shape[1], inp.q.shape[2]
    md, ns = a.get_mla_metadata(inp.cache_seqlens, s_q * h_q, 1, schedule=sched,
                                kv_format=inp.kv)
    return a.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens,
                                    512, md, ns, softmax_scale=inp.softmax_scale,
                                    causal=causal, schedule=sched,
                                    descale_k=kw.pop("descale_k", inp.k_descale), **kw)


def check(inp, sched=None, causal=True):
    """The kernel against the float64 reference on the dequantized cache: NaN masks equal,
    out within abs 2^-8 max|V| OR rel 2.01/128 with cos-diff < 5e-6 (P rounded to bf16 in
    the kernel, randn data), lse within 1e-6 OR 8.01/65536."""
    out, lse = run(inp, sched, causal)
    torch.cuda.synchronize()
    ref_o, ref_l = attention(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, 512,
                             inp.softmax_scale, causal, torch.float64,
                             kv_format=inp.kv, k_descale=inp.k_descale)
    vals = kvformat.dequantize(inp.k_cache, inp.kv, None)[..., :512]
    vmax = float(torch.nan_to_num(vals, 0.0, 0.0, 0.0).abs().max())
    if inp.k_descale is not None:
        vmax *= float(inp.k_descale.max())
    assert_close(out.float(), ref_o.to(out.dtype).float(), "out", max(8e-4, vmax / 256),
                 2.01 / 128, 5e-6)
    assert_close(lse, ref_l.float(), "lse", 1e-6, 8.01 / 65536)
    return out, lse


@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("batch,seqlens,s_q,h_q,page", [
    (4, [0, 1, 63, 64], 1, 16, 64),
    (3, [65, 4097, 1000], 1, 16, 64),
    (2, [127, 2000], 2, 16, 128),        # 32 rows
    (3, [5, 300, 129], 1, 1, 256),
    (2, [1000, 1], 8, 16, 64),           # 128 rows through 32-row tiles
    (2, [2048, 100], 1, 64, 64),
    (2, [700, 4097], 2, 128, 64),        # 256 rows
    (1, [1], 8, 32, 64),                 # rows that see no key
    (1, [20000], 1, 16, 64),             # split many ways
    (32, [4096] * 32, 1, 16, 64),
])
def test_cases_default_schedule(kv, batch, seqlens, s_q, h_q, page):
    check(inputs(kv, batch, seqlens, s_q, h_q, page))


@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("rows,knobs", [(16, {}), (32, {}), (16, dict(fp8_converters=2)),
                                        (32, dict(fp8_converters=2)),
                                        (16, dict(fp8_raw_slots=3)),
                                        (16, dict(fp8_converters=2, fp8_raw_slots=3))])
def test_explicit_schedules_and_per_sequence_descale(kv, rows, knobs):
    for per_seq in (False, True):
        inp = inputs(kv, 5, [0, 1, 95, 4097, 700], 2 if rows == 32 else 1, 16, 64, seed=3,
                     per_seq=per_seq)
        check(inp, schedule(kv, rows, **knobs))


def test_fp16_query_with_an_e4m3_cache():
    check(inputs("fp8_e4m3", 3, [64, 1000, 1], 2, 16, dtype="fp16"))


# fp8_e4m3 converted in the consumers' registers (fp8_converters = 0, mla_fp8_regs.cuh):
# one or two consumer warpgroups, 2..5 raw slots
REGS = [dict(fp8_converters=0, warps=w, fp8_raw_slots=r) for w, r in ((4, 4), (8, 4),
                                                                       (8, 2), (4, 5))]


@pytest.mark.parametrize("knobs", REGS)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_register_conversion_schedules(knobs, dtype):
    for per_seq in (False, True):
        inp = inputs("fp8_e4m3", 5, [0, 1, 95, 4097, 700], 1, 16, 64, seed=3,
                     per_seq=per_seq, dtype=dtype)
        check(inp, Schedule.build(**dict(ROWS, **knobs), rows_per_tile=16,
                                  kv_format="fp8_e4m3", dtype=dtype))


def test_register_conversion_q_rows_of_any_magnitude():
    """The per-row power of two that brings a bf16 q into fp16: rows at 2^-60, 2^40 and
    with an inf (its row NaN or inf as the reference's; the others untouched)."""
    inp = inputs("fp8_e4m3", 3, [700, 64, 1], 1, 16, edges=False)
    inp.q[0, 0, :4] *= 2.0 ** -60
    inp.q[1, 0, 4:8] *= 2.0 ** 40
    inp.q[2, 0, 8, 3] = float("inf")
    check(inp, Schedule.build(**dict(ROWS, **REGS[1]), rows_per_tile=16,
                              kv_format="fp8_e4m3"))


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(knobs=st.sampled_from(REGS), batch=st.integers(1, 5), data=st.data(),
       s_q=st.integers(1, 4), h_q=st.sampled_from([1, 16, 64]), page=st.sampled_from([64, 256]),
       causal=st.booleans(), seed=st.integers(0, 99), per_seq=st.booleans())
def test_hypothesis_register_conversion(knobs, batch, data, s_q, h_q, page, causal, seed,
                                        per_seq):
    seqlens = data.draw(st.lists(st.sampled_from(EDGES), min_size=batch, max_size=batch))
    check(inputs("fp8_e4m3", batch, seqlens, s_q, h_q, page, seed, per_seq),
          Schedule.build(**dict(ROWS, **knobs), rows_per_tile=16, kv_format="fp8_e4m3"),
          causal=causal)


# e4m3 MMAs on the register path (fp8_mma = "mma", mla_fp8_regs.cuh): against the reference
# at the mode's rounding points (Q per row, P in e4m3: reference "q_e4m3", "p_e4m3") with
# verify's allowances (mlagen.verify.oracle.mma_rounding_slack)
MMA = [dict(REGS[0], fp8_mma="mma"), dict(REGS[1], fp8_mma="mma"),
       dict(REGS[2], fp8_mma="mma")]


def mma_schedule(knobs, dtype="bf16"):
    return Schedule.build(**dict(ROWS, **knobs), rows_per_tile=16, kv_format="fp8_e4m3",
                          dtype=dtype)


def check_mma(inp, sched, causal=True):
    from mlagen.verify.compare import compare_tensor, tolerances_for
    from mlagen.verify.oracle import oracle_for

    inp = dataclasses.replace(inp, causal=causal)
    out, lse = run(inp, sched, causal)
    torch.cuda.synchronize()
    want = oracle_for(sched)(inp)
    tol = tolerances_for(inp.q.dtype)
    for name, got in (("out", out), ("lse", lse)):
        r = compare_tensor(name, got, getattr(want, name), tol[name],
                           slack=want.extra["slack"][name],
                           cos_bar=want.extra["cos_bar"])
        assert r.ok, r.summary()
    return out, lse


@pytest.mark.parametrize("knobs,dtype", [(MMA[0], "bf16"), (MMA[1], "bf16"), (MMA[2], "bf16"),
                                         (MMA[1], "fp16")])
def test_e4m3_mma_schedules(knobs, dtype):
    for per_seq in (False, True):
        inp = inputs("fp8_e4m3", 5, [0, 1, 95, 4097, 700], 1, 16, 64, seed=3,
                     per_seq=per_seq, dtype=dtype)
        check_mma(inp, mma_schedule(knobs, dtype))


def test_e4m3_mma_q_rows_of_any_magnitude_and_nan():
    """q rows at 2^-60 and 2^40 keep their own scales; a row with an inf is NaN; an e4m3
    NaN byte in a used slot makes its sequence NaN, the other untouched."""
    inp = inputs("fp8_e4m3", 3, [700, 64, 1], 1, 16, edges=False)
    inp.q[0, 0, :4] *= 2.0 ** -60
    inp.q[1, 0, 4:8] *= 2.0 ** 40
    inp.q[2, 0, 8, 3] = float("inf")
    check_mma(inp, mma_schedule(MMA[1]))
    for col in (0, 3, 130, 511, 515):
        inp = inputs("fp8_e4m3", 2, [100, 100], 1, 16, edges=False)
        blk = int(inp.block_table[0, 0])
        inp.k_cache.view(torch.uint8)[blk, 37, 0, col] = 0x7F
        out, _ = run(inp, mma_schedule(MMA[1]))
        torch.cuda.synchronize()
        assert torch.isnan(out[0]).all(), col
        assert torch.isfinite(out[1]).all(), col


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(knobs=st.sampled_from(MMA), batch=st.integers(1, 5), data=st.data(),
       s_q=st.integers(1, 4), h_q=st.sampled_from([1, 16, 64]), page=st.sampled_from([64, 256]),
       causal=st.booleans(), seed=st.integers(0, 99), per_seq=st.booleans())
def test_hypothesis_e4m3_mma(knobs, batch, data, s_q, h_q, page, causal, seed, per_seq):
    seqlens = data.draw(st.lists(st.sampled_from(EDGES), min_size=batch, max_size=batch))
    check_mma(inputs("fp8_e4m3", batch, seqlens, s_q, h_q, page, seed, per_seq),
              mma_schedule(knobs), causal=causal)


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(kv=st.sampled_from(FORMATS), batch=st.integers(1, 5), data=st.data(),
       s_q=st.integers(1, 8), h_q=st.sampled_from([1, 16, 32, 64, 128]),
       page=st.sampled_from([64, 128, 256]), causal=st.booleans(), seed=st.integers(0, 99),
       per_seq=st.booleans(), edges=st.booleans())
def test_hypothesis(kv, batch, data, s_q, h_q, page, causal, seed, per_seq, edges):
    seqlens = data.draw(st.lists(st.sampled_from(EDGES), min_size=batch, max_size=batch))
    check(inputs(kv, batch, seqlens, s_q, h_q, page, seed, per_seq, edges), causal=causal)


def test_unused_slots_are_nan_in_the_workload():
    """The tests' teeth: bytes past each sequence's end are NaN in the format's meaning."""
    inp = inputs("fp8_ds_mla", 2, [65, 1], 1, 16, edges=False)
    vals = kvformat.dequantize(inp.k_cache, "fp8_ds_mla")
    assert torch.isnan(vals).any()


@pytest.mark.parametrize("kv,col", [(kv, c) for kv in FORMATS + ("fp8_e4m3_regs",)
                                    for c in (0, 1, 2, 3, 130, 511)]
                         + [("fp8_e4m3", 515), ("fp8_e4m3_regs", 515)])   # a RoPE byte
def test_nan_byte_in_a_used_slot_propagates(kv, col):
    """An e4m3 NaN (0x7f) in a token every row sees: that sequence's output is NaN, the
    other sequence's is untouched (the converter's NaN path, at each byte of a 4-byte word
    and in a later 128-value tile)."""
    sched = None
    if kv == "fp8_e4m3_regs":
        kv, sched = "fp8_e4m3", Schedule.build(**dict(ROWS, **REGS[1]), rows_per_tile=16,
                                               kv_format="fp8_e4m3")
    inp = inputs(kv, 2, [100, 100], 1, 16, edges=False)
    blk = int(inp.block_table[0, 0])
    inp.k_cache.view(torch.uint8)[blk, 37, 0, col] = 0x7F
    out, _ = run(inp, sched)
    torch.cuda.synchronize()
    assert torch.isnan(out[0]).all()
    assert torch.isfinite(out[1]).all()


def _spread_tiles(inp):
    """fp8_ds_mla with each 128-value tile of a token at another magnitude (scales 4x apart),
    so that a scale taken from the wrong tile or applied twice changes the result."""
    vals = kvformat.dequantize(inp.k_cache, "fp8_ds_mla")
    for t in range(4):
        vals[..., 128 * t:128 * (t + 1)] *= 4.0 ** (t - 1)
    inp.k_cache = kvformat.quantize(vals, "fp8_ds_mla")
    return inp


@pytest.mark.parametrize("kv,fault", [("fp8_ds_mla", "kv_scale_wrong_tile"),
                                      ("fp8_ds_mla", "kv_scale_twice"),
                                      ("fp8_e4m3", "kv_scale_twice"),
                                      ("fp8_e4m3", "descale_not_in_output")])
def test_planted_dequantization_faults_are_caught(kv, fault):
    inp = inputs(kv, 3, [100, 1000, 64], 1, 16, edges=False)
    if kv == "fp8_ds_mla":
        inp = _spread_tiles(inp)
    check(inp, schedule(kv))                    # the sound kernel passes
    with pytest.raises(AssertionError):
        check(inp, schedule(kv, fault=fault))


def graph_replays_with_new_descale(inp):
    """A captured call (the API's default schedule) reads its descale at replay: doubled
    after capture, the replay equals a fresh call's output and differs from the first."""
    a = api()
    md, ns = a.get_mla_metadata(inp.cache_seqlens, inp.q.shape[1] * inp.q.shape[2], 1,
                                is_fp8_kvcache=True)
    desc = inp.k_descale.clone()
    run_args = (inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, 512, md, ns)
    out = a.flash_mla_with_kvcache(*run_args, descale_k=desc)      # warm (plan, build)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, _ = a.flash_mla_with_kvcache(*run_args, descale_k=desc)
    desc.mul_(2.0)
    g.replay()
    torch.cuda.synchronize()
    inp.k_descale = desc
    ref, _ = check(inp)
    assert torch.equal(o, ref)
    assert not torch.equal(o, out[0])


def test_graph_capture_replays_with_new_descale():
    graph_replays_with_new_descale(inputs("fp8_e4m3", 4, [100, 4097, 64, 1], 1, 16,
                                          per_seq=True))


@pytest.mark.parametrize("what", ["missing", "dtype", "shape", "for_ds_mla", "descale_q",
                                  "page", "width", "fp16_ds_mla", "cpu_descale"])
def test_bad_fp8_inputs_are_refused_before_launch(what):
    a = api()
    kv = "fp8_ds_mla" if what in ("for_ds_mla", "fp16_ds_mla") else "fp8_e4m3"
    inp = inputs(kv, 2, [100, 70], 1, 16, page=128 if what != "page" else 64)
    kw, sched = {}, None
    if what == "missing":
        kw["descale_k"] = None
    elif what == "dtype":
        kw["descale_k"] = inp.k_descale.double()
    elif what == "shape":
        kw["descale_k"] = torch.ones(3, dtype=torch.float32, device="cuda")
    elif what == "for_ds_mla":
        kw["descale_k"] = torch.ones(1, dtype=torch.float32, device="cuda")
    elif what == "descale_q":
        kw["descale_q"] = torch.full((2,), 0.5, dtype=torch.float16, device="cuda")
    elif what == "cpu_descale":
        kw["descale_k"] = inp.k_descale.cpu()
    elif what == "page":
        # 96-token pages: the few-rows kernel's TMA boxes need multiples of 64 (the default,
        # the 64-row kernel, gathers key by key)
        inp.k_cache = torch.zeros(4, 96, 1, 576, dtype=torch.float8_e4m3fn, device="cuda")
        inp.block_table = torch.zeros(2, 2, dtype=torch.int32, device="cuda")
        sched = schedule(kv)
    elif what == "width":
        inp.k_cache = torch.zeros(4, 64, 1, 600, dtype=torch.uint8, device="cuda")
    elif what == "fp16_ds_mla":
        inp.q = inp.q.half()
    with pytest.raises(InputError) as e:
        run(inp, sched, **kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kv", FORMATS)
def test_descale_q_multiplies_the_scores(kv):
    """vLLM's descale_q (true q = q * descale_q): ones change nothing; 0.5 a sequence equals
    half the softmax scale."""
    inp = inputs(kv, 2, [100, 70], 1, 16)
    ref, ref_lse = run(inp)
    out, _ = run(inp, descale_q=torch.ones(2, dtype=torch.float32, device="cuda"))
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    half, half_lse = run(inp, descale_q=torch.full((1,), 0.5, device="cuda"))
    inp.softmax_scale *= 0.5
    want, want_lse = run(inp)
    torch.cuda.synchronize()
    assert torch.allclose(half.float(), want.float(), atol=2e-3, rtol=1e-2)
    assert torch.allclose(half_lse, want_lse, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(half.float(), ref.float(), atol=2e-3, rtol=1e-2)


def test_bad_descale_values_give_nan_and_flag_8():
    a = api()
    inp = inputs("fp8_e4m3", 3, [100, 70, 5], 1, 16, per_seq=True)
    a.check_device_errors()
    inp.k_descale[1] = -1.0
    out, lse = run(inp)
    torch.cuda.synchronize()
    assert torch.isnan(out[1]).all() and torch.isfinite(out[0]).all()
    with pytest.raises(InputError, match="descale"):
        a.check_device_errors()
