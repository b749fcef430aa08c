"""The Hopper kernels on a GPU against a torch reference (FlashMLA's tolerances), with NaN in
unused pages and page tails, shuffled block tables, odd lengths, head counts and page sizes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlagen.errors import InputError
from mlagen.problem import make_inputs
from mlagen.schedule.records import Problem, Schedule

from hopper_util import check_against_reference, flashmla_data

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

SEQLENS = (0, 1, 63, 64, 65, 127, 1000, 4097)


def api():
    from mlagen.backends.hopper import api as a
    return a


def inputs(batch, seqlens, s_q, h_q, page, dtype="bf16", seed=0, sharp=False):
    """make_inputs' workload (NaN in unused pages and page tails, shuffled table); unless
    sharp, scaled to FlashMLA's test distribution."""
    prob = Problem(page_size=page, dtype=dtype, max_s_q=s_q)
    inp = make_inputs(prob, batch, seqlens, s_q=s_q, heads=h_q, seed=seed, device="cuda")
    if not sharp:
        inp.q, inp.k_cache = flashmla_data(inp.q, inp.k_cache)
    inp.meta["sharp"] = sharp
    return inp


def run(inp, causal=True, schedule=None):
    a = api()
    s_q, h_q = inp.q.shape[1], inp.q.shape[2]
    md, ns = a.get_mla_metadata(inp.cache_seqlens, s_q * h_q, 1, schedule=schedule)
    return a.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens,
                                    512, md, ns, softmax_scale=inp.softmax_scale,
                                    causal=causal, schedule=schedule)


def check(inp, causal=True, schedule=None):
    out, lse = run(inp, causal, schedule)
    torch.cuda.synchronize()
    check_against_reference(out, lse, inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens,
                            inp.softmax_scale, causal, sharp=inp.meta["sharp"])
    return out, lse


CASES = [
    # batch, seqlens, s_q, h_q, page, dtype, causal
    (4, [0, 1, 63, 64], 1, 16, 64, "bf16", True),
    (3, [65, 4097, 1000], 1, 128, 64, "bf16", True),
    (2, [127, 2000], 2, 64, 16, "bf16", True),
    (3, [5, 300, 64], 3, 63, 1, "bf16", True),
    (2, [1000, 1], 8, 3, 32, "fp16", True),
    (2, [700, 65], 1, 1, 128, "fp16", False),
    (2, [3000, 0], 2, 128, 256, "bf16", False),
    (1, [20000], 1, 128, 64, "bf16", True),
    (1, [1, ], 8, 16, 64, "bf16", True),     # fewer keys than queries: rows that see nothing
    (64, [2048] * 64, 1, 16, 64, "bf16", True),
    (1, [20000], 1, 16, 64, "bf16", True),    # ~150 splits: the combine's weight chunks
    (132, [640] * 132, 1, 16, 64, "bf16", True),          # whole requests, one a part
    (132, [300] * 131 + [1], 1, 128, 64, "bf16", True),   # whole requests, two a part
    # the combine's 2-split instance (grids that keep 4 or 8 rows a CTA: batch x rows >= 8 x
    # SMs): 512 CTAs of 8 rows, requests of 0-3 pieces; 512 of 4 rows; then 384 CTAs of 8
    # rows, ~3 splits a request (2-split steps)
    (32, [4097] * 16 + [0, 1, 63, 64, 65, 1000, 2000, 3000] * 2, 1, 128, 64, "bf16", True),
    (16, [2048] * 8 + [0, 1, 63, 64, 65, 1000, 3000, 4097], 2, 64, 64, "bf16", True),
    (24, [20000] * 24, 1, 128, 64, "fp16", True),
]


@pytest.fixture(params=["mma_sync", "wgmma"])
def default_mainloop(request, monkeypatch):
    """The API's default main loop for every size class (wgmma falls back to mma_sync for
    page sizes that are not multiples of 64)."""
    monkeypatch.setenv("MLAGEN_HOPPER_MAINLOOP",
                       '{"16": "%s", "32": "%s", "64": "%s"}' % ((request.param,) * 3))
    api()._resolve.cache_clear()
    yield request.param
    api()._resolve.cache_clear()


@pytest.mark.parametrize("sharp", [False, True], ids=["flashmla_data", "randn"])
@pytest.mark.parametrize("batch,seqlens,s_q,h_q,page,dtype,causal", CASES)
def test_cases(batch, seqlens, s_q, h_q, page, dtype, causal, sharp, default_mainloop):
    check(inputs(batch, seqlens, s_q, h_q, page, dtype, sharp=sharp), causal)


SCHEDULES = [None,
             dict(rows_per_tile=16, block_kv=16, buffers=1, warps=4),
             dict(rows_per_tile=32, block_kv=32, buffers=3, warps=4, split_kv=3),
             dict(rows_per_tile=64, block_kv=64, buffers=1, warps=8, split_kv=1),
             dict(rows_per_tile=16, block_kv=32, buffers=5, warps=8)]

# Deep cp.async pipelines (more stages than blocks in short pieces, one or two CTAs per SM),
# and 16-row tiles serving 32 and 64 packed rows (several row tiles per part).
DEEP = [dict(rows_per_tile=16, block_kv=32, buffers=5, warps=8),
        dict(rows_per_tile=16, block_kv=16, buffers=4, warps=8),
        dict(rows_per_tile=16, block_kv=16, buffers=8, warps=8),
        dict(rows_per_tile=32, block_kv=32, buffers=4, warps=8)]


@pytest.mark.parametrize("knobs", DEEP, ids=lambda k: "r{rows_per_tile}_bkv{block_kv}_buf{buffers}"
                         .format(**k))
@pytest.mark.parametrize("s_q,h_q,page", [(1, 16, 64), (2, 16, 16), (1, 64, 1), (3, 7, 32)])
def test_deep_pipelines(knobs, s_q, h_q, page):
    for sharp in (False, True):
        inp = inputs(5, [0, 1, 95, 4097, 700], s_q, h_q, page, seed=3, sharp=sharp)
        check(inp, True, Schedule.build(target="hopper", **knobs))


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(batch=st.integers(1, 5), data=st.data(),
       s_q=st.sampled_from([1, 2, 3, 8]), h_q=st.sampled_from([1, 3, 16, 63, 64, 128]),
       page=st.sampled_from([1, 16, 32, 64, 128]), dtype=st.sampled_from(["bf16", "fp16"]),
       causal=st.booleans(), knobs=st.sampled_from(SCHEDULES), seed=st.integers(0, 99),
       sharp=st.booleans())
def test_hypothesis(batch, data, s_q, h_q, page, dtype, causal, knobs, seed, sharp):
    seqlens = data.draw(st.lists(st.sampled_from(SEQLENS), min_size=batch, max_size=batch))
    sched = None if knobs is None else Schedule.build(target="hopper", dtype=dtype, **knobs)
    check(inputs(batch, seqlens, s_q, h_q, page, dtype, seed, sharp=sharp), causal, sched)


def test_noncontiguous_q():
    inp = inputs(3, [100, 1, 2000], 2, 16, 64)
    wide = torch.zeros(3, 2, 32, 576, dtype=inp.q.dtype, device="cuda")
    wide[:, :, 1::2] = inp.q
    inp.q = wide[:, :, 1::2]              # every other head of a wider tensor
    assert not inp.q.is_contiguous()
    check(inp)
    inp.q = inp.q.transpose(1, 2).contiguous().transpose(1, 2)   # s_q stride < h stride
    assert not inp.q.is_contiguous()
    check(inp)


@pytest.mark.parametrize("seqlens,rows,whole", [
    ([0, 1, 64, 65, 5000, 300, 12000, 7], 128, False),   # equal pieces of 5 blocks
    ([1] * 60 + [64000] * 2, 128, False),                 # the balanced plan
    ([4096] * 128, 16, True),                             # whole requests (the chunk plan)
    ([4096] * 127 + [4160], 128, True),                   # two a part, one a block longer
    ([8192] * 128, 128, False),                           # chunks cost 3 blocks too much
    ([16384] * 128, 16, True),    # equal pieces of 256 blocks, within one split of the payload
    ([32768] * 128, 32, False),   # 512 blocks against a payload of 502 + 5: balanced
])
def test_metadata_matches_python_model(seqlens, rows, whole):
    from mlagen.backends.hopper import scheduler
    t = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    md, ns = api().get_mla_metadata(t, rows, 1)
    meta, splits = scheduler.plan(seqlens, md.shape[0])
    assert md.cpu().tolist() == meta
    assert ns.cpu().tolist() == splits
    assert (splits == list(range(len(seqlens) + 1))) == whole


# (b = 32: one request twice as long as the rest, so that the cluster merge (a b = 32 batch's
# requests in 2 pieces each, merged without the combine) is not the plan)
@pytest.mark.parametrize("batch,lens", [(32, [4097] * 23 + [8193] + [0, 1, 63, 64, 65, 1000,
                                                                    2000, 3000]),
                                         (16, [4097] * 8 + [0, 1, 63, 64, 65, 1000, 2000, 3000]),
                                         (2, [4097, 3000])])
def test_planted_split_merge_fault_is_caught_in_both_combine_variants(batch, lens):
    """The combine's two instances (8 splits a step while the grid has under 4 rows a CTA, 2
    once it keeps 4 or 8: batch x rows >= 8 x SMs, here 32 or 16 x 128 against 2 x 128):
    bad_split_merge (partials summed without their lse weights) planted in the combine must
    fail the reference check on each, and the same schedule unfaulted must pass (so the
    failure is the fault's)."""
    from mlagen.paths import SCHEDULES_DIR
    from mlagen.schedule import load

    sched = load(SCHEDULES_DIR / "hopper_wgmma.toml")
    inp = inputs(batch, lens, 1, 128, 64, seed=5)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert (batch * 128 >= 8 * sms) == (batch >= 16)     # the 2-split instance, or not
    check(inp, True, sched)
    md, ns = api().get_mla_metadata(inp.cache_seqlens, 128, 1, schedule=sched)
    assert int((ns[1:] - ns[:-1]).max()) >= 2, (       # some request was split
        f"parts {md.shape[0]}, md[:4] {md[:4].tolist()}, ns {ns.tolist()}, "
        f"lens {inp.cache_seqlens.tolist()}")
    with pytest.raises(AssertionError):
        check(inp, True, sched.with_fault("bad_split_merge"))


def test_cuda_graph_replay():
    a = api()
    inp = inputs(4, [100, 2000, 65, 4000], 1, 64, 64)
    run(inp)                       # build and warm up outside the capture
    seqlens = inp.cache_seqlens.clone()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            md, ns = a.get_mla_metadata(seqlens, 64, 1)
            out, lse = a.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, seqlens,
                                                512, md, ns, softmax_scale=inp.softmax_scale,
                                                causal=True)
    torch.cuda.current_stream().wait_stream(s)
    for lens in ([100, 2000, 65, 4000], [1, 1500, 0, 3999]):
        seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        g.replay()
        torch.cuda.synchronize()
        check_against_reference(out, lse, inp.q, inp.k_cache, inp.block_table, seqlens,
                                inp.softmax_scale, True)


def test_torch_compile():
    a = api()
    inp = inputs(2, [300, 2500], 1, 16, 64)

    def step(q, k, bt, lens):
        md, ns = a.get_mla_metadata(lens, 16, 1)
        out, lse = a.flash_mla_with_kvcache(q, k, bt, lens, 512, md, ns,
                                            softmax_scale=inp.softmax_scale, causal=True)
        return out * 2, lse

    compiled = torch.compile(step, fullgraph=False)
    out2, lse = compiled(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens)
    check_against_reference(out2 / 2, lse, inp.q, inp.k_cache, inp.block_table,
                            inp.cache_seqlens, inp.softmax_scale, True)


def test_bad_block_table_is_rejected_in_strict_mode():
    a = api()
    inp = inputs(2, [100, 200], 1, 16, 64)
    inp.block_table[1, 2] = inp.k_cache.shape[0] + 5     # page 2 of sequence 1 is used
    a.set_strict(True)
    try:
        with pytest.raises(InputError, match="block_table"):
            run(inp)
        inp.block_table[1, 2] = -1
        with pytest.raises(InputError, match="block_table"):
            run(inp)
    finally:
        a.set_strict(False)


def test_seqlen_beyond_table_is_rejected_in_strict_mode():
    a = api()
    inp = inputs(2, [100, 200], 1, 16, 64)
    inp.cache_seqlens[0] = inp.block_table.shape[1] * 64 + 1
    a.set_strict(True)
    try:
        with pytest.raises(InputError, match="cache_seqlens"):
            run(inp)
    finally:
        a.set_strict(False)


@pytest.mark.parametrize("fault", ["page_high", "page_negative", "len_beyond_table",
                                   "len_negative"])
@pytest.mark.parametrize("h_q,lens", [(16, [100, 5000]), (128, [3000, 20000])])
def test_bad_input_gives_nan_and_the_device_flag_without_a_sync(fault, h_q, lens):
    """The default call checks nothing on the host: the kernel gives the bad sequence NaN
    (split or not), leaves the other one exact, and sets the device error flag."""
    a = api()
    inp = inputs(2, lens, 1, h_q, 64)
    a.check_device_errors()                  # start clean
    if fault == "page_high":
        inp.block_table[1, 3] = 1 << 30
    elif fault == "page_negative":
        inp.block_table[1, 0] = -7
    elif fault == "len_beyond_table":
        inp.cache_seqlens[1] = inp.block_table.shape[1] * 64 + 1
    else:
        inp.cache_seqlens[1] = -5
    out, lse = run(inp)
    torch.cuda.synchronize()
    assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all()
    assert torch.isfinite(out[0]).all() and torch.isfinite(lse[0]).all()
    flags = int(a.device_error_flags().item())
    assert flags == (2 if fault == "len_negative" else 1)
    with pytest.raises(InputError, match="negative" if fault == "len_negative" else "block_table"):
        a.check_device_errors()
    assert int(a.device_error_flags().item()) == 0          # cleared
    a.check_device_errors()                                  # and quiet again


def test_repeated_calls_reuse_the_plan_and_still_reject_wrong_tensors():
    """The per-signature plan: a second call with other data gives that data's answer, and
    a wrong tensor after a cached call is still an InputError before any launch."""
    a = api()
    inp = inputs(3, [100, 2000, 65], 1, 16, 64)
    check(inp)
    inp2 = inputs(3, [100, 2000, 65], 1, 16, 64, seed=5)
    check(inp2)                                  # same signature, other data
    md, ns = a.get_mla_metadata(inp.cache_seqlens, 16, 1)
    with pytest.raises(InputError, match="int32"):
        a.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table.long(),
                                 inp.cache_seqlens, 512, md, ns)
    with pytest.raises(InputError, match="k_cache"):
        a.flash_mla_with_kvcache(inp.q, inp.k_cache.half(), inp.block_table,
                                 inp.cache_seqlens, 512, md, ns)


@pytest.fixture
def python_path_fails(monkeypatch):
    """Once called, the Python call path of a cached plan raises: what follows must go
    through the C++ one (fastcall.cpp)."""
    from mlagen.backends.hopper import ops

    def forbid():
        def python_path(*args, **kw):
            raise AssertionError("the Python call path ran")
        monkeypatch.setattr(ops.DecodePlan, "run", python_path)
        monkeypatch.setattr(ops.MetadataPlan, "run", python_path)
    return forbid


@pytest.mark.parametrize("batch,seqlens,s_q,h_q,page,dtype,causal", CASES)
def test_cases_through_the_cpp_call_path(batch, seqlens, s_q, h_q, page, dtype, causal,
                                         python_path_fails):
    """Each case's second call (other data, same signature; metadata and decode) goes
    through the C++ path and matches the reference; the metadata it made equals the
    Python path's."""
    a = api()
    inp = inputs(batch, seqlens, s_q, h_q, page, dtype)
    check(inp, causal)      # makes the plans
    assert a._LAST[0] is not None and a._LAST[0].fast is not None
    assert a._LAST_METADATA[0] is not None and a._LAST_METADATA[0].fast is not None
    md0, ns0 = a._LAST_METADATA[0].run(inp.cache_seqlens)
    python_path_fails()
    md, ns = a.get_mla_metadata(inp.cache_seqlens, s_q * h_q, 1)
    assert torch.equal(md, md0) and torch.equal(ns, ns0)
    check(inputs(batch, seqlens, s_q, h_q, page, dtype, seed=7), causal)


@pytest.mark.parametrize("fault", ["page_high", "len_negative"])
def test_the_cpp_call_path_flags_bad_input_on_the_device(fault, python_path_fails):
    a = api()
    check(inputs(2, [100, 5000], 1, 128, 64))
    a.check_device_errors()
    python_path_fails()
    inp = inputs(2, [100, 5000], 1, 128, 64, seed=3)
    if fault == "page_high":
        inp.block_table[1, 3] = 1 << 30
    else:
        inp.cache_seqlens[1] = -5
    out, lse = run(inp)
    torch.cuda.synchronize()
    assert torch.isnan(out[1]).all() and torch.isfinite(out[0]).all()
    with pytest.raises(InputError):
        a.check_device_errors()


def test_calls_the_cpp_path_does_not_take_fall_back_to_python():
    """Another signature after a C++ call, a misaligned q, another softmax scale, strict
    mode and out=: each takes the Python path and is still right; then the C++ path again."""
    from mlagen.backends.hopper import ops

    a = api()
    inp = inputs(3, [100, 2000, 65], 1, 16, 64)
    check(inp)
    check(inp)                                           # the C++ path
    check(inputs(2, [700, 1], 1, 16, 64))                # another batch
    q = inp.q
    base = torch.empty(q.numel() + 8, dtype=q.dtype, device=q.device)
    inp.q = base[1:1 + q.numel()].view(q.shape).copy_(q)  # same strides, 2 bytes off
    assert inp.q.data_ptr() % 16
    check(inp)
    inp.q = q
    inp.softmax_scale = inp.softmax_scale * 0.5
    check(inp)
    a.set_strict(True)
    try:
        check(inp)
    finally:
        a.set_strict(False)
    md, ns = a.get_mla_metadata(inp.cache_seqlens, 16, 1)
    out = torch.empty(3, 1, 16, 512, dtype=q.dtype, device=q.device)
    lse = torch.empty(3, 16, 1, dtype=torch.float32, device=q.device)
    a.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, 512,
                             md, ns, softmax_scale=inp.softmax_scale, causal=True,
                             out=(out, lse))
    torch.cuda.synchronize()
    check_against_reference(out, lse, inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens,
                            inp.softmax_scale, True)
    calls = []
    real = ops.DecodePlan.run_fast

    def counted(self, *args):
        r = real(self, *args)
        calls.append(r is not None)
        return r
    ops.DecodePlan.run_fast = counted
    try:
        check(inp)
    finally:
        ops.DecodePlan.run_fast = real
    assert calls and calls[-1]


def test_the_plan_carries_the_device_sm_count():
    """The combine sizes its grid by the device's SMs (twice them: the CTAs that fill it), read
    once per device on the host and passed in shape[]; b = 1 at h_q = 16 gives it a single
    row per CTA, the small-grid end of that rule, checked against the reference."""
    from mlagen.backends.hopper import abi

    a = api()
    a._DECODE_PLANS.clear()
    inp = inputs(1, [20000], 1, 16, 64)
    check(inp)
    plans = list(a._DECODE_PLANS.values())
    sms = torch.cuda.get_device_properties(inp.q.device).multi_processor_count
    assert plans and all(p.shape[abi.SHAPE_INDEX["num_sms"]] == sms for p in plans)


def test_wrong_device_mix():
    inp = inputs(1, [10], 1, 16, 64)
    a = api()
    md, ns = a.get_mla_metadata(inp.cache_seqlens, 16, 1)
    with pytest.raises(InputError, match="CUDA"):
        a.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table.cpu(), inp.cache_seqlens,
                                 512, md, ns)


def test_runner_through_mlagen_run():
    import mlagen
    s = mlagen.load_schedule(Path(mlagen.paths.SCHEDULES_DIR) / "hopper_h200.toml")
    inp = inputs(2, [70, 900], 1, 128, 64)
    res = mlagen.run(s, inp)
    torch.cuda.synchronize()
    check_against_reference(res.out, res.lse, inp.q, inp.k_cache, inp.block_table,
                            inp.cache_seqlens, inp.softmax_scale, True)


@pytest.mark.cuda
def test_out_pair_is_written_in_place_and_checked():
    """out=(out, lse): every element is written (NaN-poisoned first), wrong pairs rejected."""
    import mlagen

    inp = make_inputs(Problem(heads=16), 3, [0, 65, 300], s_q=2, heads=16, seed=3,
                      device="cuda")
    md, ns = mlagen.get_mla_metadata(inp.cache_seqlens, 2 * 16, 1)
    out = torch.full((3, 2, 16, 512), float("nan"), dtype=inp.q.dtype, device="cuda")
    lse = torch.full((3, 16, 2), float("nan"), dtype=torch.float32, device="cuda")
    o, l = mlagen.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table,
                                         inp.cache_seqlens, 512, md, ns, causal=True,
                                         out=(out, lse))
    assert o.data_ptr() == out.data_ptr() and l.data_ptr() == lse.data_ptr()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    ref_o, ref_l = mlagen.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table,
                                                 inp.cache_seqlens, 512, md, ns, causal=True)
    assert torch.equal(out, ref_o) and torch.equal(lse, ref_l)
    with pytest.raises(InputError):
        mlagen.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens,
                                      512, md, ns, causal=True, out=(out[:, :1], lse))
    shifted = torch.empty(out.numel() + 4, dtype=out.dtype, device="cuda")[4:].view(out.shape)
    with pytest.raises(InputError, match="16-byte"):
        mlagen.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens,
                                      512, md, ns, causal=True, out=(shifted, lse))



# ------------------------------------------------------------- NaN and Inf inputs ------
@pytest.mark.parametrize("name", ["hopper_h200", "hopper_wgmma", "hopper_wgmma_r16",
                                  "hopper_wgmma_r32_fp16"])
@pytest.mark.parametrize("where", ["q", "cache"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")],
                         ids=["nan", "+inf", "-inf"])
@pytest.mark.parametrize("causal", [True, False])
def test_non_finite_inputs_follow_the_conventions_rule(name, where, value, causal):
    """docs/conventions.md, "NaN and Inf": a NaN or +inf score is a NaN row (out and lse),
    never an empty one; a -inf score weighs nothing.  Short sequences take the direct
    path, the 4097-token one splits (partial lse, the combine)."""
    import dataclasses

    import mlagen
    from mlagen.schedule import load
    from mlagen.verify.compare import compare
    from mlagen.verify.oracle import oracle_for
    from mlagen.verify.strategies import Poison, poison

    s = load(Path(__file__).resolve().parents[1] / "schedules" / f"{name}.toml")
    h = s.heads_per_device
    inp = make_inputs(s.problem, 3, [5, 4097, 1], s_q=2, heads=h, seed=3, device="cuda")
    inp = dataclasses.replace(inp, causal=causal)
    col = 7 if where == "q" else 100
    inp = poison(inp, [Poison(where, 0, 1 if where == "q" else 2, h - 1, col, value),
                       Poison(where, 1, 0, 0, col + 1, value)])
    want = oracle_for(s)(inp, dtype=torch.float64)
    got = mlagen.run(s, inp)
    torch.cuda.synchronize()
    cmp = compare(got, want, s.problem.dtype)
    assert cmp.ok, cmp.summary()
