"""The wgmma main loop (mla_wgmma.cuh) on a GPU: explicit wgmma schedules against the torch
reference with FlashMLA's tolerances (NaN in unused pages and page tails, shuffled tables,
lengths 0, 1 and page edges, several row tiles), bad pages, its page-size refusal, and the
faults planted in it being caught."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlagen.errors import InputError
from mlagen.schedule.records import Schedule

from hopper_util import rising_scores
from test_hopper_gpu import SEQLENS, api, check, inputs, run

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

WGMMA = dict(target="hopper", mainloop="wgmma", rows_per_tile=64, block_kv=64, buffers=2,
             warps=8)
EDGES = (0, 1, 2, 63, 64, 65, 127, 128, 129, 1000, 4097)
COSTS = (1, 2, 5, 5, 8, 64)          # split_cost: the default twice, tuned.json's 2 and 8, the ends


def wgmma(dtype="bf16", **kw):
    return Schedule.build(**WGMMA, dtype=dtype, **kw)


@pytest.mark.parametrize("sharp", [False, True], ids=["flashmla_data", "randn"])
@pytest.mark.parametrize("batch,seqlens,s_q,h_q,page,dtype,causal", [
    (4, [0, 1, 63, 64], 1, 128, 64, "bf16", True),
    (3, [65, 4097, 1000], 1, 64, 64, "bf16", True),
    (2, [127, 2000], 2, 128, 128, "bf16", True),     # 256 rows: 4 row tiles
    (3, [5, 300, 64], 3, 63, 256, "fp16", True),
    (2, [1000, 1], 8, 16, 64, "fp16", False),
    (1, [20000], 1, 128, 64, "bf16", True),          # a long request split many ways
    (1, [1], 8, 16, 64, "bf16", True),               # rows that see no key
    (64, [2048] * 64, 1, 128, 64, "bf16", True),
])
def test_cases(batch, seqlens, s_q, h_q, page, dtype, causal, sharp):
    check(inputs(batch, seqlens, s_q, h_q, page, dtype, sharp=sharp), causal, wgmma(dtype))


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(batch=st.integers(1, 6), data=st.data(),
       s_q=st.sampled_from([1, 2, 3, 8]), h_q=st.sampled_from([1, 3, 16, 64, 100, 128]),
       page=st.sampled_from([64, 128, 256]), dtype=st.sampled_from(["bf16", "fp16"]),
       causal=st.booleans(), split=st.sampled_from(["auto", "auto", 1, 3]),
       cost=st.sampled_from(COSTS), seed=st.integers(0, 99), sharp=st.booleans())
def test_hypothesis(batch, data, s_q, h_q, page, dtype, causal, split, cost, seed, sharp):
    seqlens = data.draw(st.lists(st.sampled_from(EDGES + SEQLENS), min_size=batch,
                                 max_size=batch))
    check(inputs(batch, seqlens, s_q, h_q, page, dtype, seed, sharp=sharp), causal,
          wgmma(dtype, split_kv=split, split_cost=cost))


@pytest.mark.parametrize("batch,seqlen,cost", [(32, 1024, 2), (1, 32768, 8), (3, 4097, 1),
                                               (5, 2000, 64)])
def test_split_costs_of_the_tuned_table(batch, seqlen, cost):
    """The split costs tuned.json ships (2 at b=32, 8 at b=1; h_q = 128) and the knob's
    ends, on the tuned shapes: other splits, same answer."""
    seqlens = [seqlen - 7 * i for i in range(batch)]
    check(inputs(batch, seqlens, 1, 128, 64, "bf16", sharp=True), True,
          wgmma("bf16", split_cost=cost))


def test_bad_pages_give_nan_and_the_device_flag():
    a = api()
    inp = inputs(3, [100, 5000, 70], 1, 128, 64)
    a.check_device_errors()                  # start clean
    inp.block_table[1, 3] = 1 << 30
    inp.block_table[2, 1] = -5
    out, lse = run(inp, schedule=wgmma())
    torch.cuda.synchronize()
    assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all()
    assert torch.isnan(out[2]).all()
    assert torch.isfinite(out[0]).all()
    assert int(a.device_error_flags().item()) == 1
    with pytest.raises(InputError, match="block_table"):
        a.check_device_errors()


def test_small_pages_are_refused_by_an_explicit_wgmma_schedule():
    inp = inputs(1, [100], 1, 128, 16)
    with pytest.raises(InputError, match="multiple of 64"):
        run(inp, schedule=wgmma())


@pytest.mark.parametrize("fault", ["causal_off_by_one", "skip_partial_page"])
def test_planted_faults_are_caught(fault):
    """A fault planted in the wgmma main loop fails the reference check on inputs the
    hypothesis test draws (a partial last page of NaN-poisoned slots; causal s_q > 1)."""
    inp = inputs(3, [65, 1000, 130], 2, 128, 64, seed=1)
    s = wgmma().with_fault(fault)
    with pytest.raises(AssertionError):
        check(inp, True, s)
    check(inp, True, wgmma())             # the same inputs pass without the fault


def test_verify_runs_the_example_schedule():
    from mlagen.paths import SCHEDULES_DIR
    from mlagen.schedule import load
    from mlagen.verify import verify
    from mlagen.verify.strategies import Bounds

    s = load(SCHEDULES_DIR / "hopper_wgmma.toml")
    r = verify(s, examples=40, progress=False,
               bounds=Bounds(max_batch=4, max_len=300, long_len=1100, max_extra_table=2))
    assert r.ok, r.summary()
    assert r.poisoned


# ---- the few-rows kernel (mla_wgmma_rows.cuh): mainloop = "wgmma", 16 or 32 rows per tile,
# one consumer warpgroup (warps = 4) or two taking alternate blocks (warps = 8)
def rows_kernel(rows, dtype="bf16", warps=4, **kw):
    return Schedule.build(target="hopper", mainloop="wgmma", rows_per_tile=rows, block_kv=64,
                          buffers=2, warps=warps, dtype=dtype, **kw)


@pytest.mark.parametrize("warps", [4, 8], ids=["w4", "w8"])
@pytest.mark.parametrize("rows", [16, 32])
@pytest.mark.parametrize("batch,seqlens,s_q,h_q,page,dtype,causal", [
    (4, [0, 1, 63, 64], 1, 16, 64, "bf16", True),
    (3, [65, 4097, 1000], 2, 16, 64, "bf16", True),    # 32 rows: two 16-row tiles
    (3, [5, 300, 129], 3, 7, 256, "fp16", True),       # 21 rows
    (2, [1000, 1], 4, 8, 128, "fp16", False),
    (1, [20000], 1, 16, 64, "bf16", True),             # a long request split many ways
    (1, [1], 8, 4, 64, "bf16", True),                  # rows that see no key
    (2, [3000, 2], 1, 1, 64, "bf16", True),            # one row
    (64, [2048] * 64, 1, 32, 64, "bf16", True),
])
def test_rows_cases(rows, warps, batch, seqlens, s_q, h_q, page, dtype, causal):
    for sharp in (False, True):
        check(inputs(batch, seqlens, s_q, h_q, page, dtype, sharp=sharp), causal,
              rows_kernel(rows, dtype, warps))


@pytest.mark.parametrize("rows", [16, 32])
@pytest.mark.parametrize("seqlens,causal", [
    ([129, 191, 1, 0], True),          # 3, 3, 1 and 0 blocks: odd counts, WG1 idle or empty
    ([65, 128, 64, 63], False),        # 2, 2, 1, 1 blocks; tails of 1 and 63 keys
    ([4097, 4033, 193], True),         # 65, 64 (a full last block) and 4 blocks
])
def test_rows_two_consumers_block_counts(rows, seqlens, causal):
    """Two consumer warpgroups on whole requests (split_kv = 1: the block counts are the
    requests' own): odd counts leave WG1 one block short, a 1-block request leaves it
    idle, an empty one leaves both idle; the merged output against the reference."""
    for sharp in (False, True):
        for s_q, h_q in ((1, 16), (2, 16), (1, 5)):
            check(inputs(len(seqlens), seqlens, s_q, h_q, 64, sharp=sharp, seed=s_q + h_q),
                  causal, rows_kernel(rows, warps=8, split_kv=1))


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(batch=st.integers(1, 6), data=st.data(), rows=st.sampled_from([16, 32]),
       warps=st.sampled_from([4, 8]),
       s_q=st.sampled_from([1, 2, 3, 4]), h_q=st.sampled_from([1, 3, 8, 16]),
       page=st.sampled_from([64, 128, 256]), dtype=st.sampled_from(["bf16", "fp16"]),
       causal=st.booleans(), split=st.sampled_from(["auto", "auto", 1, 3]),
       cost=st.sampled_from(COSTS), seed=st.integers(0, 99), sharp=st.booleans())
def test_rows_hypothesis(batch, data, rows, warps, s_q, h_q, page, dtype, causal, split, cost,
                         seed, sharp):
    seqlens = data.draw(st.lists(st.sampled_from(EDGES + SEQLENS), min_size=batch,
                                 max_size=batch))
    check(inputs(batch, seqlens, s_q, h_q, page, dtype, seed, sharp=sharp), causal,
          rows_kernel(rows, dtype, warps, split_kv=split, split_cost=cost))


@pytest.mark.parametrize("warps", [4, 8], ids=["w4", "w8"])
def test_rows_bad_pages_give_nan_and_the_device_flag(warps):
    """A bad block-table entry in an odd block (WG1's with two consumer warpgroups) and in an
    even one (WG0's): those requests' output is NaN, the others' finite, the flag set."""
    a = api()
    inp = inputs(4, [100, 5000, 70, 300], 1, 16, 64)
    a.check_device_errors()
    inp.block_table[1, 3] = 1 << 30     # block 3
    inp.block_table[2, 1] = -5          # block 1
    inp.block_table[3, 2] = 1 << 29     # block 2
    out, lse = run(inp, schedule=rows_kernel(16, warps=warps, split_kv=1))
    torch.cuda.synchronize()
    for r in (1, 2, 3):
        assert torch.isnan(out[r]).all() and torch.isnan(lse[r]).all(), r
    assert torch.isfinite(out[0]).all() and torch.isfinite(lse[0]).all()
    assert int(a.device_error_flags().item()) == 1
    with pytest.raises(InputError, match="block_table"):
        a.check_device_errors()


@pytest.mark.parametrize("fault,rows,warps", [
    ("causal_off_by_one", 16, 4), ("skip_partial_page", 32, 4), ("causal_off_by_one", 32, 4),
    ("causal_off_by_one", 16, 8), ("skip_partial_page", 16, 8), ("skip_partial_page", 32, 8),
    ("wrong_scale", 32, 8)], ids=lambda v: f"w{v}" if v in (4, 8) else str(v))
def test_rows_planted_faults_are_caught(fault, rows, warps):
    # a 1 % scale error hides in FlashMLA's small scores (lse off by ~1e-5): sharp data for it
    inp = inputs(3, [65, 1000, 130], 2, 16, 64, seed=1, sharp=fault == "wrong_scale")
    with pytest.raises(AssertionError):
        check(inp, True, rows_kernel(rows, warps=warps).with_fault(fault))
    check(inp, True, rows_kernel(rows, warps=warps))


@pytest.mark.parametrize("warps", [4, 8], ids=["w4", "w8"])
def test_rows_faults_reach_both_consumer_warpgroups(warps):
    """skip_partial_page leaves the NaN tail of the last block unzeroed: with split_kv = 1 a
    request of 65 keys ends in block 1 (WG1's with two warpgroups), one of 130 in block 2
    (WG0's); each alone must fail the check."""
    for seqlens in ([65, 64], [130, 64]):
        inp = inputs(2, seqlens, 1, 16, 64, seed=4)
        with pytest.raises(AssertionError):
            check(inp, True, rows_kernel(16, warps=warps, split_kv=1)
                  .with_fault("skip_partial_page"))
        check(inp, True, rows_kernel(16, warps=warps, split_kv=1))


@pytest.mark.parametrize("example", ["hopper_wgmma_r16", "hopper_wgmma_r32_fp16",
                                     "hopper_wgmma_r16_w8", "hopper_wgmma_r32_w8"])
def test_verify_runs_the_rows_examples(example):
    from mlagen.paths import SCHEDULES_DIR
    from mlagen.schedule import load
    from mlagen.verify import verify
    from mlagen.verify.strategies import Bounds

    r = verify(load(SCHEDULES_DIR / f"{example}.toml"), examples=40, progress=False,
               bounds=Bounds(max_batch=4, max_len=300, long_len=1100, max_extra_table=2))
    assert r.ok, r.summary()
    assert r.poisoned


KERNELS = {"r64": lambda: wgmma(), "r16_w4": lambda: rows_kernel(16), "r32_w4": lambda: rows_kernel(32),
           "r16_w8": lambda: rows_kernel(16, warps=8), "r32_w8": lambda: rows_kernel(32, warps=8)}


@pytest.mark.parametrize("step", [3, 6, 12])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_rising_scores_move_the_running_max_mid_piece(kernel, step):
    """The conditional rescale (kRescaleSlack in mla_common.cuh) on scores that climb along
    each sequence: rows' maxima move mid-piece, past the slack (O rescaled) on some blocks
    and inside it (no rescale, P up to 2^8) on others; causal s_q = 2, lengths across page
    edges, the long request split.  FlashMLA-like data never moves a max past the slack
    after a piece's first block, so without this test that path would go unchecked."""
    h_q = 128 if kernel == "r64" else 16
    inp = inputs(3, [65, 1000, 4097], 2, h_q, 64, seed=2)
    inp.q, inp.k_cache = rising_scores(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens,
                                       inp.softmax_scale, step)
    inp.meta["sharp"] = True      # P concentrated on a few keys: the sharp-data bound
    check(inp, True, KERNELS[kernel]())


# ---- the cluster merge (mla_scheduler.cuh's cluster plan, merge_out in mla_wgmma.cuh): a
# request's c pieces in one thread-block cluster, merged through distributed shared memory

def _cluster_of(inp, schedule=None):
    """(the cluster size the library launches with, metadata, num_splits) for inp."""
    from mlagen.backends.hopper import ops

    a = api()
    s_q, h_q = inp.q.shape[1], inp.q.shape[2]
    dtype = "fp16" if inp.q.dtype == torch.float16 else "bf16"
    sched = schedule or wgmma(dtype)
    md, ns = a.get_mla_metadata(inp.cache_seqlens, s_q * h_q, 1, schedule=sched)
    key = a._library_key(s_q * h_q, dtype, sched)
    c = ops.get(key).lib.mlagen_hopper_cluster(inp.q.shape[0], md.shape[0])
    return c, md, ns


def _assert_cluster_plan(inp, md, ns, c):
    from mlagen.backends.hopper import scheduler

    b = inp.q.shape[0]
    assert c > 1, "the device holds no clusters of this kernel"
    meta, splits = scheduler.plan(inp.cache_seqlens.tolist(), md.shape[0],
                                  scheduler.FIXED_COST, c)
    assert md.cpu().tolist() == meta and ns.cpu().tolist() == splits   # GPU == model
    assert splits == list(range(b + 1)) and all(m[5] == c for m in meta[:b * c])


CLUSTER_CASES = [
    # batch, seqlens, s_q, h_q, dtype, causal
    (32, [1024] * 32, 1, 128, "bf16", True),      # 2 row tiles: clusters of 2
    (32, [2048] * 32, 1, 64, "bf16", True),       # 1 row tile, 132 parts: no clusters
    (32, [0, 1, 63, 64, 65, 127, 128, 129] + [1024] * 24, 1, 128, "bf16", True),  # empty pieces
    (32, [1024] * 32, 2, 64, "fp16", True),       # causal rows over two query positions
    (30, [1024 - 7 * i for i in range(30)], 1, 100, "bf16", False),   # padded rows
    (31, [1024] * 31, 1, 128, "bf16", True),      # two clusters left without a piece
]


@pytest.mark.parametrize("sharp", [False, True], ids=["flashmla_data", "randn"])
@pytest.mark.parametrize("batch,seqlens,s_q,h_q,dtype,causal", CLUSTER_CASES)
def test_cluster_merge_cases(batch, seqlens, s_q, h_q, dtype, causal, sharp):
    inp = inputs(batch, seqlens, s_q, h_q, 64, dtype, seed=3, sharp=sharp)
    c, md, ns = _cluster_of(inp)
    out, _ = check(inp, causal, wgmma(dtype))
    from mlagen.backends.hopper import scheduler
    meta, _ = scheduler.plan(seqlens, md.shape[0], scheduler.FIXED_COST, c)
    if meta[0][5]:                                   # the model says the cluster plan
        _assert_cluster_plan(inp, md, ns, c)
    out2, _ = run(inp, causal, wgmma(dtype))
    assert torch.equal(out, out2)                     # the merge's order is fixed


@pytest.mark.parametrize("scale", [2.0 ** 20, 2.0 ** -40], ids=["large", "tiny"])
@pytest.mark.parametrize("path", ["cluster_merge", "fp16_partials"])
def test_fp16_exchange_keeps_the_range_of_v(path, scale):
    """The cluster merge sends its quarter, and a split piece writes its partial, in fp16
    with a per-row power-of-two scale: V far beyond fp16's range (2^20, bf16 values up to
    1e6) and far below it (2^-40) give the output of the unscaled inputs times the scale
    (q's first 512 columns scaled by 1 / scale, so the scores are bit-identical)."""
    if path == "cluster_merge":
        inp = inputs(32, [1024 - 9 * i for i in range(32)], 1, 128, 64, seed=4)
        c, md, ns = _cluster_of(inp)
        _assert_cluster_plan(inp, md, ns, c)
    else:   # b = 16, s_q = 2, h_q = 64 (a graph row): 4 pieces a request, the combine
        inp = inputs(16, [2048 - 9 * i for i in range(16)], 2, 64, 64, seed=4)
        md, ns = api().get_mla_metadata(inp.cache_seqlens, 128, 1, schedule=wgmma())
        assert int((ns[1:] - ns[:-1]).min()) >= 2, ns.tolist()   # every request split
    base_out, base_lse = check(inp, True, wgmma())
    inp.k_cache[..., :512] *= scale
    inp.q[..., :512] /= scale
    out, lse = run(inp, True, wgmma())
    torch.cuda.synchronize()
    assert torch.equal(lse, base_lse)
    got = out.double() / scale
    want = base_out.double()
    assert torch.isfinite(got).all()
    # the same element bound as the unscaled check (abs 8e-4 or 2.01 / 128 relative)
    err = (got - want).abs()
    assert bool(((err <= 8e-4) | (err <= 2.01 / 128 * want.abs())).all()), float(err.max())


def test_cluster_plan_is_taken_on_the_graph_row():
    """b = 32, s_k = 1024, h_q = 128 (a graph row of the benchmark of record): the cluster plan, so no
    partials and no combine work."""
    inp = inputs(32, [1024] * 32, 1, 128, 64)
    c, md, ns = _cluster_of(inp)
    _assert_cluster_plan(inp, md, ns, c)


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(data=st.data(), s_q=st.sampled_from([1, 2]), h_q=st.sampled_from([16, 64, 100, 128]),
       page=st.sampled_from([64, 128]), dtype=st.sampled_from(["bf16", "fp16"]),
       causal=st.booleans(), base=st.integers(0, 3000), seed=st.integers(0, 99),
       sharp=st.booleans())
def test_cluster_hypothesis(data, s_q, h_q, page, dtype, causal, base, seed, sharp):
    """Near-equal batches small enough for clusters, lengths off by page edges: the GPU
    scheduler matches the model (cluster plan or not), and the output the reference."""
    from mlagen.backends.hopper import scheduler

    tiles = -(-s_q * h_q // 64)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    batch = data.draw(st.integers(1, max(1, sms // tiles // 2)))
    seqlens = [max(0, base + d) for d in data.draw(st.lists(
        st.sampled_from([0, 0, 1, -1, 63, -63, 64, 65, -65]), min_size=batch,
        max_size=batch))]
    inp = inputs(batch, seqlens, s_q, h_q, page, dtype, seed, sharp=sharp)
    c, md, ns = _cluster_of(inp, wgmma(dtype))
    meta, splits = scheduler.plan(seqlens, md.shape[0], scheduler.FIXED_COST, c)
    assert md.cpu().tolist() == meta and ns.cpu().tolist() == splits
    check(inp, causal, wgmma(dtype))


def test_cluster_bad_pages_give_nan_and_the_device_flag():
    a = api()
    inp = inputs(32, [1024] * 32, 1, 128, 64)
    c, md, ns = _cluster_of(inp)
    _assert_cluster_plan(inp, md, ns, c)
    a.check_device_errors()
    inp.block_table[5, 12] = 1 << 30          # in request 5's second piece
    inp.block_table[9, 0] = -3                # in request 9's first
    out, lse = run(inp, schedule=wgmma())
    torch.cuda.synchronize()
    for r in (5, 9):
        assert torch.isnan(out[r]).all() and torch.isnan(lse[r]).all()
    ok = [r for r in range(32) if r not in (5, 9)]
    assert torch.isfinite(out[ok]).all() and torch.isfinite(lse[ok]).all()
    assert int(a.device_error_flags().item()) == 1
    with pytest.raises(InputError, match="block_table"):
        a.check_device_errors()


@pytest.mark.parametrize("knobs", [
    dict(mainloop="wgmma", rows_per_tile=16, block_kv=64, buffers=2, warps=4),   # few rows
    dict(mainloop="mma_sync", rows_per_tile=64, block_kv=32, buffers=3, warps=8),
], ids=["rows", "mma_sync"])
def test_cluster_metadata_given_to_another_kernel_gives_nan_and_flag_4(knobs):
    """Metadata planned for the 64-row kernel's cluster merge (h_q = 64: one row tile on
    every SM, parts / 2 requests) given to a decode that another kernel runs (the few-rows
    wgmma kernel, the mma_sync one): those never merge, so each half would write the output
    alone, a silently wrong answer; instead every piece is NaN and device flag 4 is set."""
    from mlagen.backends.hopper import scheduler
    from mlagen.backends.hopper.ops import sm_count

    a = api()
    lens = scheduler.cluster_lengths(64, sm_count(torch.device("cuda")))
    b = len(lens)
    assert b > 0
    plan = inputs(b, lens, 1, 64, 64)
    md, ns = a.get_mla_metadata(plan.cache_seqlens, 64, 1, schedule=wgmma())
    assert all(m[5] == 2 for m in md.cpu().tolist()[:2 * b])
    inp = inputs(b, lens, 1, 16, 64)
    a.check_device_errors()                  # start clean
    out, lse = a.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table,
                                        inp.cache_seqlens, 512, md, ns,
                                        softmax_scale=inp.softmax_scale, causal=True,
                                        schedule=Schedule.build(target="hopper", **knobs))
    torch.cuda.synchronize()
    assert torch.isnan(out).all() and torch.isnan(lse).all()
    assert int(a.device_error_flags().item()) == 4
    with pytest.raises(InputError, match="tile_scheduler_metadata planned for another"):
        a.check_device_errors()


@pytest.mark.parametrize("fault", ["causal_off_by_one", "skip_partial_page", "bad_split_merge"])
def test_planted_faults_are_caught_in_the_cluster_merge(fault):
    """Faults in the main loop and in the merge itself (bad_split_merge: the pieces summed
    without their weights) fail the reference check on cluster-plan inputs."""
    inp = inputs(32, [1024 - 5 * i for i in range(32)], 2, 64, 64, seed=2)
    c, md, ns = _cluster_of(inp)
    _assert_cluster_plan(inp, md, ns, c)
    with pytest.raises(AssertionError):
        check(inp, True, wgmma().with_fault(fault))
    check(inp, True, wgmma())
