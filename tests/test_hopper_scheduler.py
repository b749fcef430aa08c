"""The split scheduler's arithmetic on the CPU: the C++ code the GPU runs (plan_splits in
templates/hopper/include/mla_scheduler.cuh, compiled here with g++) against the Python model
(mlagen/backends/hopper/scheduler.py), and the properties a split must have.  Also the
input checks of the API that run without a GPU."""

from __future__ import annotations

import ctypes

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlagen.backends.hopper import scheduler
from mlagen.errors import InputError, ScheduleError
from mlagen.schedule.records import Schedule

from hopper_util import build_header_harness

HARNESS = r"""
#include "mla_scheduler.cuh"
extern "C" void plan(const int* seqlens, int batch, int parts, int fixed, int fixed_splits,
                     int cluster, int* sched, int* num_splits) {
  int* nblk = new int[batch];
  long long* cum = new long long[batch + 1];
  for (int i = 0; i < batch; ++i) nblk[i] = mlagen::hopper::sched_blocks(seqlens[i]);
  if (fixed_splits > 0)
    mlagen::hopper::plan_fixed_splits(nblk, batch, fixed_splits, sched, num_splits);
  else
    mlagen::hopper::plan_splits(nblk, batch, parts, fixed, cum, sched, num_splits, cluster);
  delete[] nblk;
  delete[] cum;
}
extern "C" int cluster(int batch, int parts, int max_c) {
  return mlagen::hopper::sched_cluster(batch, parts, max_c, nullptr);
}
"""


@pytest.fixture(scope="module")
def cpp_plan(tmp_path_factory):
    lib = build_header_harness(tmp_path_factory.mktemp("sched"), HARNESS)

    def plan(seqlens, parts, fixed_splits=0, cost=scheduler.FIXED_COST, cluster=1):
        b = len(seqlens)
        n_parts = b * fixed_splits if fixed_splits else parts
        s = (ctypes.c_int * b)(*seqlens)
        md = (ctypes.c_int * (n_parts * 8))()
        ns = (ctypes.c_int * (b + 1))()
        lib.plan(s, b, parts, cost, fixed_splits, cluster, md, ns)
        return [list(md[i * 8:(i + 1) * 8]) for i in range(n_parts)], list(ns)

    plan.lib = lib
    return plan


seqlens_st = st.lists(st.one_of(st.integers(0, 200), st.integers(0, 40000)), min_size=1,
                      max_size=40)
# split_cost, the schedule knob (rules: 1..64); tuned.json ships 2 and 8 beside the default 5
cost_st = st.one_of(st.sampled_from([1, 2, 3, 5, 8, 12]), st.integers(1, 64))


@settings(max_examples=200, deadline=None)
@given(seqlens=seqlens_st, parts=st.integers(1, 140), cost=cost_st)
def test_cpp_matches_python_model(cpp_plan, seqlens, parts, cost):
    assert cpp_plan(seqlens, parts, cost=cost) == scheduler.plan(seqlens, parts, cost)


# near-equal requests, so that the cluster plan is often taken (and page-edge lengths)
near_equal_st = st.integers(1, 40).flatmap(lambda b: st.tuples(
    st.integers(0, 5000), st.lists(st.sampled_from([0, 0, 0, 1, -63, 63, 64, 65]),
                                   min_size=b, max_size=b))).map(
    lambda t: [max(0, t[0] + d) for d in t[1]])


@settings(max_examples=200, deadline=None)
@given(seqlens=st.one_of(seqlens_st, near_equal_st), parts=st.integers(1, 140), cost=cost_st,
       cluster=st.sampled_from([2, 4]))
def test_cpp_cluster_plan_matches_python_model(cpp_plan, seqlens, parts, cost, cluster):
    """The split kernel launched in clusters (mla_scheduler.cuh's cluster plan): C++ and
    the model agree, and every token is still covered once."""
    got = cpp_plan(seqlens, parts, cost=cost, cluster=cluster)
    assert got == scheduler.plan(seqlens, parts, cost, cluster)
    _check_split(seqlens, *got)


@pytest.mark.parametrize("seqlens,parts,cluster,taken", [
    ([1024] * 32, 66, 2, True),        # b = 32 h_q 128: 2 pieces of 8 blocks either way
    ([2048] * 32, 132, 4, True),       # b = 32 h_q 64: 4 pieces of 8 blocks
    ([1024] * 32, 66, 1, False),       # no clusters: the equal plan
    ([1024] * 34, 66, 2, False),       # 68 pieces do not fit 66 parts
    ([64 * 16] * 31 + [64 * 17], 66, 2, False),   # one piece of 9 blocks against 8
    ([0, 1, 63, 64, 65, 127, 128, 129] + [1024] * 24, 66, 2, True),   # empty pieces too
])
def test_cluster_plan_is_taken_where_its_pieces_are_no_longer(seqlens, parts, cluster, taken):
    meta, ns = scheduler.plan(seqlens, parts, scheduler.FIXED_COST, cluster)
    assert (ns == list(range(len(seqlens) + 1)) and meta[0][5] == cluster) == taken
    if taken:
        assert all(m[5] == cluster for m in meta[:len(seqlens) * cluster])
        assert all(m[0] > m[2] for m in meta[len(seqlens) * cluster:])   # the rest empty
    _check_split(seqlens, meta, ns)


@pytest.mark.parametrize("rows,sms,b", [(128, 132, 33), (16, 132, 66), (64, 114, 57),
                                         (128, 114, 0), (128, 2, 0)])
def test_verify_cluster_lengths_take_the_cluster_plan(cpp_plan, rows, sms, b):
    """`verify`'s explicit input for the cluster merge (cluster_lengths): parts / 2 requests
    with lengths 0, 1 and page edges, whose plan, in C++ as in the model, is the cluster
    plan on every part it uses, launched in clusters (sched_cluster); none where the parts
    are odd (114 SMs or 2, with 2 row tiles)."""
    lens = scheduler.cluster_lengths(rows, sms)
    assert len(lens) == b
    if not b:
        return
    parts = scheduler.num_parts(sms, rows, 64)
    assert {0, 1, 63, 64, 65} <= set(lens)
    assert cpp_plan.lib.cluster(b, parts, 2) == 2
    meta, ns = cpp_plan(lens, parts, cost=scheduler.FIXED_COST, cluster=2)
    assert all(m[5] == 2 for m in meta[:2 * b]) and ns == list(range(b + 1))
    _check_split(lens, meta, ns)


@settings(max_examples=50, deadline=None)
@given(seqlens=seqlens_st, n=st.integers(1, 6))
def test_cpp_fixed_split_matches_python_model(cpp_plan, seqlens, n):
    assert cpp_plan(seqlens, 0, n) == scheduler.plan_fixed(seqlens, n)


def _check_split(seqlens, meta, num_splits, parts_limit=None):
    """Every token of every request is covered exactly once; slots are unique, in range,
    and a request's pieces fill slots num_splits[r] .. num_splits[r+1]-1; one split <=>
    direct."""
    b = len(seqlens)
    pcs = scheduler.pieces(seqlens, meta, num_splits)
    assert num_splits[0] == 0 and all(x <= y for x, y in zip(num_splits, num_splits[1:]))
    assert num_splits[-1] <= b + len(meta)            # the workspace the op allocates
    for r in range(b):
        mine = sorted((p for p in pcs if p.request == r), key=lambda p: (p.start, p.end))
        merged = mine[0].merge if mine else 0
        if merged:
            # the cluster plan: c pieces on the parts of one aligned cluster, merged on chip,
            # one output slot (written directly, nothing for the combine)
            assert len(mine) == merged and num_splits[r + 1] - num_splits[r] == 1
            assert all(p.merge == merged and p.direct for p in mine)
            assert sorted(p.part for p in mine) == list(range(r * merged, (r + 1) * merged))
        else:
            assert len(mine) == num_splits[r + 1] - num_splits[r] >= 1
            assert sorted(p.slot for p in mine) == list(range(num_splits[r], num_splits[r + 1]))
        pos = 0
        for p in mine:
            assert p.start == pos and p.end >= p.start
            pos = p.end
            assert merged or p.direct == (len(mine) == 1)
        assert pos == max(seqlens[r], 0)


@settings(max_examples=200, deadline=None)
@given(seqlens=seqlens_st, parts=st.integers(1, 140), cost=cost_st)
def test_split_covers_every_token_once(seqlens, parts, cost):
    meta, ns = scheduler.plan(seqlens, parts, cost)
    _check_split(seqlens, meta, ns)


@settings(max_examples=50, deadline=None)
@given(seqlens=seqlens_st, n=st.integers(1, 6))
def test_fixed_split_covers_every_token_once(seqlens, n):
    meta, ns = scheduler.plan_fixed(seqlens, n)
    _check_split(seqlens, meta, ns)


def test_split_is_balanced():
    """Equal requests over 132 parts, too long for whole ones (a part of one request would
    cost 517 units against a payload of 502 + 5): each part carries the payload, give or
    take one request's overhead (counted here in the part of the request's first block,
    though its units may lie in the part before)."""
    seqlens = [32768] * 128
    meta, ns = scheduler.plan(seqlens, 132)
    assert ns[-1] > 128                                 # not the chunk plan
    loads = [0] * 132
    for p in scheduler.pieces(seqlens, meta, ns):
        loads[p.part] += scheduler.blocks(p.end - p.start)
        if p.start == 0:
            loads[p.part] += scheduler.FIXED_COST
    total = sum(scheduler.blocks(s) + scheduler.FIXED_COST for s in seqlens)
    payload = -(-total // 132)
    assert max(loads) <= payload + scheduler.FIXED_COST
    assert min(loads[:-1]) >= payload - scheduler.FIXED_COST and loads[-1] > 0
    assert sum(loads) == total


@pytest.mark.parametrize("b,sk,parts,per", [(128, 8192, 132, 1), (128, 4096, 66, 2),
                                            (128, 4096, 132, 1), (8, 640, 2, 4)])
def test_equal_requests_run_whole(b, sk, parts, per):
    """Near-equal requests: whole ones, `per` consecutive a part, none split, when the
    fullest part costs at most payload + one split (b = 128 of 8192 tokens over 132 parts:
    133 units against 129 + 5; the balanced plan split 127 of them)."""
    meta, ns = scheduler.plan([sk] * b, parts)
    assert ns == list(range(b + 1))
    for p, md in enumerate(meta):
        r0, r1 = min(p * per, b), min((p + 1) * per, b) - 1
        assert md == [r0, 0, r1, scheduler.blocks(sk) * 64 if r1 >= r0 else 0, 0, 0, 0, 0]
    _check_split([sk] * b, meta, ns)


@pytest.mark.parametrize("cost", [1, 5, 9])
def test_whole_requests_up_to_one_split_over_the_payload(cost):
    """The rules' edges.  Equal pieces (b <= parts): two requests of 10 and x blocks over 2
    parts, one piece each while x <= ceil((10 + x + 2 cost) / 2) + cost, i.e.
    x <= 10 + 4 cost + 1.  Chunks (b > parts): requests of 10, 10 and x blocks over 2 parts,
    whole while x + cost <= ceil((20 + x + 3 cost) / 2) + cost, i.e. x <= 20 + 3 cost + 1."""
    edge = 10 + 4 * cost + 1
    for x, whole in ((edge, True), (edge + 1, False)):
        meta, ns = scheduler.plan([640, 64 * x], 2, cost)
        assert (ns == [0, 1, 2]) == whole, (x, ns)
    edge = 20 + 3 * cost + 1
    for x, whole in ((edge, True), (edge + 1, False)):
        meta, ns = scheduler.plan([640, 640, 64 * x], 2, cost)
        assert (ns == [0, 1, 2, 3]) == whole, (x, ns)


def test_a_broken_chunk_plan_is_caught():
    """The coverage check is not vacuous on the chunk plan: the plan with each part's last
    request dropped (an off-by-one in its chunk end) fails it."""
    seqlens = [4096] * 128
    meta, ns = scheduler.plan(seqlens, 66)
    assert ns == list(range(129))
    broken = [[m[0], m[1], m[2] - 1, m[3], *m[4:]] for m in meta]
    with pytest.raises(AssertionError):
        _check_split(seqlens, broken, ns)


near_equal_st = st.builds(lambda base, b, jitter: [max(0, base + j) for j in jitter[:b]],
                          st.integers(0, 20000), st.integers(1, 300),
                          st.lists(st.integers(-200, 200), min_size=300, max_size=300))


@settings(max_examples=150, deadline=None)
@given(seqlens=near_equal_st, parts=st.integers(1, 140), cost=cost_st)
def test_near_equal_batches_plan_like_the_model(cpp_plan, seqlens, parts, cost):
    """Near-equal lengths draw both plans (whole requests and balanced splits): the C++
    plan matches the model and covers every token once."""
    meta, ns = scheduler.plan(seqlens, parts, cost)
    assert cpp_plan(seqlens, parts, cost=cost) == (meta, ns)
    _check_split(seqlens, meta, ns)


def test_known_plan(cpp_plan):
    """A hand-checked balanced plan: 3 requests of 10, 40 and 10 blocks over 4 parts at a
    split cost of 1: costs 11, 41, 11 -> payload 16.  Equal pieces would need 20 blocks
    (10 | 20 + 20 | 10), more than 16 + 1; whole requests 41 units against 16 + 1; so the
    balanced plan: request 1's blocks sit at units 12-51, so parts 0-3 take its blocks 0-3,
    4-19, 20-35, 36-39 (part 0 after request 0, part 3 before request 2)."""
    meta, ns = scheduler.plan([640, 2560, 640], 4, 1)
    assert meta == [[0, 0, 1, 4 * 64, 0, 0, 0, 0], [1, 4 * 64, 1, 20 * 64, 1, 0, 0, 0],
                    [1, 20 * 64, 1, 36 * 64, 2, 0, 0, 0], [1, 36 * 64, 2, 640, 3, 0, 0, 0]]
    assert ns == [0, 1, 5, 6]
    assert cpp_plan([640, 2560, 640], 4, cost=1) == (meta, ns)


def test_equal_pieces_one_split_over_the_payload(cpp_plan):
    """The same requests at the default split cost 5: costs 15, 45, 15 -> payload 19; equal
    pieces of 20 blocks are within one split of it, so request 1 takes two pieces of 20
    rather than the balanced plan's three.  And the bench's b = 128 of 16384 tokens over 132
    parts: whole requests (pieces of 256 blocks against a payload of 254), not 257 pieces."""
    meta, ns = scheduler.plan([640, 2560, 640], 4)
    assert meta == [[0, 0, 0, 640, 0, 0, 0, 0], [1, 0, 1, 1280, 0, 0, 0, 0],
                    [1, 1280, 1, 2560, 1, 0, 0, 0], [2, 0, 2, 640, 0, 0, 0, 0]]
    assert ns == [0, 1, 3, 4]
    meta, ns = scheduler.plan([16384] * 128, 132)
    assert ns == list(range(129))
    assert meta[:128] == [[r, 0, r, 16384, 0, 0, 0, 0] for r in range(128)]
    assert cpp_plan([16384] * 128, 132) == (meta, ns)


def test_known_equal_plan():
    """A hand-checked equal plan: 2 requests of 2 and 79 blocks over 132 parts fit in pieces
    of 1 block (81 parts) and the payload is ceil(91 / 132) = 1: request 0 on parts 0-1,
    request 1 on parts 2-80, the rest empty."""
    meta, ns = scheduler.plan([100, 5000], 132)
    assert meta[0] == [0, 0, 0, 64, 0, 0, 0, 0]
    assert meta[1] == [0, 64, 0, 128, 1, 0, 0, 0]      # its 2nd piece, 36 tokens of it
    assert meta[2] == [1, 0, 1, 64, 0, 0, 0, 0]
    assert meta[80] == [1, 78 * 64, 1, 79 * 64, 78, 0, 0, 0]
    assert meta[81:] == [[2, 0, 1, 0, 0, 0, 0, 0]] * 51
    assert ns == [0, 2, 81]


@pytest.mark.parametrize("b,sk,parts,piece", [(32, 1024, 66, 8), (4, 4096, 66, 4),
                                              (1, 32768, 66, 8), (16, 2048, 66, 8)])
def test_small_batches_take_equal_pieces(b, sk, parts, piece):
    """The bench's small-batch graph rows: every request in equal pieces, one a part (b = 4
    of 4096 tokens: 16 pieces of 4 blocks each on 64 parts, where the balanced plan left
    parts holding only a request's overhead)."""
    meta, ns = scheduler.plan([sk] * b, parts)
    per = scheduler.blocks(sk) // piece
    assert ns == [r * per for r in range(b + 1)]
    assert all(m[3] - m[1] == piece * 64 for m in meta[:b * per])
    _check_split([sk] * b, meta, ns)


def test_larger_payload_packs_whole_requests():
    """Short requests share a part: 4 requests of 64 tokens over 2 parts (cost 6 each,
    payload 12): two whole requests per part, one split each."""
    meta, ns = scheduler.plan([64] * 4, 2)
    assert meta == [[0, 0, 1, 64, 0, 0, 0, 0], [2, 0, 3, 64, 0, 0, 0, 0]]
    assert ns == [0, 1, 2, 3, 4]


# --------------------------------------------------------------- input checks (CPU) -----
def _api():
    from mlagen.backends.hopper import api
    return api


def _args(**over):
    b, s_q, h = 2, 1, 16
    a = dict(q=torch.zeros(b, s_q, h, 576, dtype=torch.bfloat16),
             k_cache=torch.zeros(4, 64, 1, 576, dtype=torch.bfloat16),
             block_table=torch.zeros(b, 2, dtype=torch.int32),
             cache_seqlens=torch.zeros(b, dtype=torch.int32), head_dim_v=512,
             tile_scheduler_metadata=torch.zeros(132, 8, dtype=torch.int32),
             num_splits=torch.zeros(b + 1, dtype=torch.int32))
    a.update(over)
    return a


@pytest.mark.parametrize("over,match", [
    (dict(q=torch.zeros(2, 1, 16, 576, dtype=torch.float32)), "bfloat16 or float16"),
    (dict(k_cache=torch.zeros(4, 64, 1, 576, dtype=torch.float16)), "k_cache is"),
    (dict(q=torch.zeros(2, 1, 16, 512, dtype=torch.bfloat16)), "576"),
    (dict(q=torch.zeros(2, 9, 16, 576, dtype=torch.bfloat16)), "s_q"),
    (dict(q=torch.zeros(2, 1, 129, 576, dtype=torch.bfloat16)), "h_q"),
    (dict(k_cache=torch.zeros(4, 64, 2, 576, dtype=torch.bfloat16)), "h_kv"),
    (dict(k_cache=torch.zeros(4, 512, 1, 576, dtype=torch.bfloat16)), "page size"),
    (dict(head_dim_v=128), "head_dim_v"),
    (dict(block_table=torch.zeros(2, 2, dtype=torch.int64)), "int32"),
    (dict(block_table=torch.zeros(3, 2, dtype=torch.int32)), "block_table"),
    (dict(cache_seqlens=torch.zeros(3, dtype=torch.int32)), "cache_seqlens"),
    (dict(num_splits=torch.zeros(2, dtype=torch.int32)), "num_splits"),
    (dict(tile_scheduler_metadata=torch.zeros(132, 4, dtype=torch.int32)), "metadata"),
    (dict(q=torch.zeros(2, 1, 16, 1152, dtype=torch.bfloat16)[..., ::2]), "contiguous"),
    ({}, "CUDA device"),
])
def test_bad_inputs_raise_input_error(over, match):
    with pytest.raises(InputError, match=match):
        _api().flash_mla_with_kvcache(**_args(**over))


def test_out_pair_must_start_on_a_16_byte_boundary():
    """The epilogue copies out's rows with 16-byte bulk copies: a contiguous out= that
    starts 8 bytes off is refused before launch (CPU: the check runs before any device)."""
    api = _api()
    q = torch.zeros(2, 1, 16, 576, dtype=torch.bfloat16)
    lse = torch.zeros(2, 16, 1)
    out = torch.zeros(2, 1, 16, 512, dtype=torch.bfloat16)
    api._check_out(q, (out, lse))
    shifted = torch.zeros(out.numel() + 4, dtype=out.dtype)[4:].view(out.shape)
    assert shifted.is_contiguous() and shifted.data_ptr() % 16 == 8
    with pytest.raises(InputError, match="16-byte boundary"):
        api._check_out(q, (shifted, lse))


def test_bad_softmax_scale():
    with pytest.raises(InputError, match="softmax_scale"):
        _api().flash_mla_with_kvcache(**_args(), softmax_scale=-1.0)


def test_metadata_input_checks():
    api = _api()
    with pytest.raises(InputError, match="int32"):
        api.get_mla_metadata(torch.zeros(2, dtype=torch.int64), 16, 1)
    with pytest.raises(InputError, match="num_heads_k"):
        api.get_mla_metadata(torch.zeros(2, dtype=torch.int32), 16, 2)
    with pytest.raises(InputError, match="CUDA device"):
        api.get_mla_metadata(torch.zeros(2, dtype=torch.int32), 16, 1)


def test_input_error_is_a_value_error():
    assert issubclass(InputError, ValueError)


WGMMA = dict(target="hopper", mainloop="wgmma", rows_per_tile=64, block_kv=64, buffers=2,
             warps=8)


def test_wgmma_mainloop_is_legal_with_its_knobs():
    s = Schedule.build(**WGMMA)
    assert s.mapping.mainloop == "wgmma"
    assert "wgmma" in s.variant_name()


@pytest.mark.parametrize("key,value", [("block_kv", 32), ("buffers", 3), ("warps", 4)])
def test_wgmma_mainloop_rejects_other_knobs(key, value):
    with pytest.raises(ScheduleError, match=f"wgmma.*needs {key}"):
        Schedule.build(**dict(WGMMA, **{key: value}))


@pytest.mark.parametrize("rows", [16, 32])
def test_wgmma_few_rows_kernel_knobs(rows):
    """mainloop = "wgmma" with 16 or 32 rows per tile is the few-rows kernel
    (mla_wgmma_rows.cuh): one consumer warpgroup (warps = 4) or two taking alternate blocks
    (warps = 8), 64-key blocks, 2 stages; its variant name says the rows, the consumer warps
    and the main loop."""
    s = Schedule.build(**dict(WGMMA, rows_per_tile=rows, warps=4))
    name = s.variant_name()
    assert f"r{rows}" in name and "wgmma" in name and "w4" in name
    assert name != Schedule.build(**WGMMA).variant_name()
    two = Schedule.build(**dict(WGMMA, rows_per_tile=rows, warps=8)).variant_name()
    assert "w8" in two and f"r{rows}" in two and two != name
    with pytest.raises(ScheduleError, match="rows_per_tile = %d needs warps = 4 or 8" % rows):
        Schedule.build(**dict(WGMMA, rows_per_tile=rows, warps=2))
    with pytest.raises(ScheduleError, match="rows_per_tile = 64 needs warps = 8"):
        Schedule.build(**dict(WGMMA, warps=4))
    with pytest.raises(ScheduleError, match="needs block_kv"):
        Schedule.build(**dict(WGMMA, rows_per_tile=rows, warps=4, block_kv=32))
    with pytest.raises(ScheduleError, match="multiple of 64"):
        Schedule.build(**dict(WGMMA, rows_per_tile=rows, warps=4), page_size=16)


def test_wgmma_knobs_per_class_override(monkeypatch):
    from mlagen.backends.hopper import defaults
    monkeypatch.setenv("MLAGEN_HOPPER_MAINLOOP", '{"16": "wgmma", "32": "wgmma"}')
    monkeypatch.setenv("MLAGEN_HOPPER_WGMMA_KNOBS", '{"32": [32, 64, 2, 4]}')
    s16, s32 = defaults.default_schedule(16), defaults.default_schedule(17)
    assert (s16.mapping.mainloop, s16.mapping.rows_per_tile, s16.mapping.warps) == \
        ("wgmma", defaults.WGMMA_KNOBS[16][0], defaults.WGMMA_KNOBS[16][3])
    assert (s32.mapping.mainloop, s32.mapping.rows_per_tile, s32.mapping.warps) == \
        ("wgmma", 32, 4)
    assert defaults.rows_for(20) == 32
    # pages that are not multiples of 64: the class's mma_sync tile
    assert defaults.default_schedule(16, page_size=16).mapping.mainloop == "mma_sync"


@pytest.mark.parametrize("page", [1, 16, 32])
def test_wgmma_mainloop_rejects_pages_not_multiple_of_64(page):
    with pytest.raises(ScheduleError, match="multiple of 64"):
        Schedule.build(**WGMMA, page_size=page)


def test_default_falls_back_to_mma_sync_for_small_pages(monkeypatch):
    from mlagen.backends.hopper import defaults
    monkeypatch.setenv("MLAGEN_HOPPER_MAINLOOP", '{"64": "wgmma"}')
    assert defaults.default_schedule(128, page_size=64).mapping.mainloop == "wgmma"
    assert defaults.default_schedule(128, page_size=128).mapping.mainloop == "wgmma"
    s = defaults.default_schedule(128, page_size=16)
    assert s.mapping.mainloop == "mma_sync"
    assert s.mapping.rows_per_tile == defaults.WGMMA_KNOBS[64][0]   # same metadata either way


def test_canonical_keeps_a_planted_fault():
    from mlagen.backends.hopper import defaults
    s = Schedule.build(**WGMMA).with_fault("causal_off_by_one")
    assert defaults.canonical(s).fault == "causal_off_by_one"


@pytest.mark.parametrize("knobs,key", [
    (dict(rows_per_tile=64, block_kv=64, buffers=2, warps=8), "shared memory"),
    (dict(rows_per_tile=64, block_kv=32, buffers=2, warps=4), "registers"),
    (dict(rows_per_tile=48), "rows_per_tile"),
])
def test_schedules_that_do_not_fit_are_rejected(knobs, key):
    with pytest.raises(ScheduleError, match=key):
        Schedule.build(target="hopper", **knobs)


def test_pipeline_depth_limits():
    # deep cp.async pipelines are a hopper knob (up to 8 stages, if they fit in shared memory)
    assert Schedule.build(target="hopper", rows_per_tile=16, block_kv=16, buffers=8).mapping.buffers == 8
    with pytest.raises(ScheduleError, match="buffers"):
        Schedule.build(target="hopper", rows_per_tile=16, block_kv=16, buffers=9)
    with pytest.raises(ScheduleError, match="shared memory"):
        Schedule.build(target="hopper", rows_per_tile=16, block_kv=32, buffers=6)
    with pytest.raises(ScheduleError, match="buffers = 4 must be 1, 2 or 3"):
        Schedule.build(target="sc11", buffers=4)


def test_tile_knobs_override(monkeypatch):
    from mlagen.backends.hopper import defaults
    monkeypatch.setenv("MLAGEN_HOPPER_TILE_KNOBS", '{"32": [16, 32, 5, 8], "16": [16, 2, 4]}')
    monkeypatch.setenv("MLAGEN_HOPPER_MAINLOOP",
                       '{"16": "mma_sync", "32": "mma_sync", "64": "mma_sync"}')
    s32 = defaults.default_schedule(32)
    assert (s32.mapping.rows_per_tile, s32.mapping.block_kv, s32.mapping.buffers) == (16, 32, 5)
    assert defaults.rows_for(17) == 16
    s16 = defaults.default_schedule(5)
    assert (s16.mapping.rows_per_tile, s16.mapping.block_kv, s16.mapping.buffers,
            s16.mapping.warps) == (16, 16, 2, 4)
    assert defaults.rows_for(33) == defaults.TILE_KNOBS[64][0]
    monkeypatch.delenv("MLAGEN_HOPPER_MAINLOOP")
    if defaults.MAINLOOP[32] == "wgmma":        # the knobs of a class on wgmma are its own
        assert defaults.default_schedule(32).mapping.rows_per_tile == defaults.WGMMA_KNOBS[32][0]
        assert defaults.rows_for(17) == defaults.WGMMA_KNOBS[32][0]


@pytest.mark.parametrize("var,value,needle", [
    ("MLAGEN_HOPPER_TILE_KNOBS", '{"16": [16, 2', "is not JSON (Expecting"),
    ("MLAGEN_HOPPER_TILE_KNOBS", "[16, 32, 2, 8]", "must be a JSON object"),
    ("MLAGEN_HOPPER_TILE_KNOBS", '{"8": [16, 2, 4]}', 'class "8" must be one of "16", "32", "64"'),
    ("MLAGEN_HOPPER_TILE_KNOBS", '{"16": [16, 2]}', 'class "16": [16, 2] must be'),
    ("MLAGEN_HOPPER_TILE_KNOBS", '{"16": [16, 2.5, 4]}', "(integers)"),
    ("MLAGEN_HOPPER_TILE_KNOBS", '{"16": ["16", 2, 4]}', "(integers)"),
    ("MLAGEN_HOPPER_TILE_KNOBS", '{"16": [true, 2, 4]}', "(integers)"),
    ("MLAGEN_HOPPER_TILE_KNOBS", '{"32": [48, 32, 2, 8]}',
     "[48, 32, 2, 8] is not a legal mma_sync schedule (rows_per_tile = 48"),
    ("MLAGEN_HOPPER_WGMMA_KNOBS", '{"32": [32, 64, 2]}',
     "must be [rows_per_tile, block_kv, buffers, warps] (integers)"),
    ("MLAGEN_HOPPER_WGMMA_KNOBS", '{"16": [16, 32, 2, 4]}', "not a legal wgmma schedule"),
    ("MLAGEN_HOPPER_WGMMA_KNOBS", '{"64": {"rows": 64}}', "must be [rows_per_tile"),
    ("MLAGEN_HOPPER_MAINLOOP", '{"16": "cutlass"}', '"cutlass" must be "mma_sync" or "wgmma"'),
    ("MLAGEN_HOPPER_MAINLOOP", '{"16": 1}', '1 must be "mma_sync" or "wgmma"'),
    ("MLAGEN_HOPPER_MAINLOOP", '"wgmma"', "must be a JSON object"),
])
def test_malformed_overrides_are_schedule_errors(var, value, needle, monkeypatch):
    """A bad environment override: a ScheduleError of one line that names the variable,
    the bad value and the rule (never a KeyError, TypeError or JSONDecodeError)."""
    from mlagen.backends.hopper import defaults
    monkeypatch.setenv(var, value)
    for call in (defaults.check_overrides, lambda: defaults.default_schedule(64),
                 lambda: defaults.default_schedule(16), lambda: defaults.default_schedule(32)):
        with pytest.raises(ScheduleError) as e:
            call()
        msg = str(e.value)
        assert msg.startswith(var + ": ") and needle in msg and "\n" not in msg, msg


def test_well_formed_overrides_pass_the_checks(monkeypatch):
    from mlagen.backends.hopper import defaults
    monkeypatch.setenv("MLAGEN_HOPPER_TILE_KNOBS", '{"16": [16, 2, 4]}')
    monkeypatch.setenv("MLAGEN_HOPPER_WGMMA_KNOBS", '{"32": [32, 64, 2, 4]}')
    monkeypatch.setenv("MLAGEN_HOPPER_MAINLOOP", '{"64": "mma_sync"}')
    defaults.check_overrides()
    assert defaults.tile_knobs()[16] == (16, 16, 2, 4)
    assert defaults.wgmma_knobs()[32] == (32, 64, 2, 4)
    assert defaults.mainloops() == {**defaults.MAINLOOP, 64: "mma_sync"}


def test_plan_signature_covers_what_the_checks_read():
    """A cached decode plan is reused only for the same call signature: any change of a
    shape, stride, dtype or argument that check_inputs looks at gives another key (so the
    full checks run again and a wrong tensor is still rejected before launch)."""
    from mlagen.backends.hopper import api

    q = torch.zeros(2, 1, 16, 576, dtype=torch.bfloat16)
    k = torch.zeros(8, 64, 1, 576, dtype=torch.bfloat16)
    bt = torch.zeros(2, 4, dtype=torch.int32)
    sl = torch.zeros(2, dtype=torch.int32)
    md = torch.zeros(132, 8, dtype=torch.int32)
    ns = torch.zeros(3, dtype=torch.int32)
    base = (q, k, bt, sl, 512, md, ns, None, True, None)
    key = api._signature(*base)
    assert api._signature(*base) == key
    variants = [
        (q.half(), k, bt, sl, 512, md, ns, None, True, None),
        (q[:, :, ::2], k, bt, sl, 512, md, ns, None, True, None),
        (q, k.half(), bt, sl, 512, md, ns, None, True, None),
        (q, k[:4], bt, sl, 512, md, ns, None, True, None),
        (q, k, bt.long(), sl, 512, md, ns, None, True, None),
        (q, k, bt.t().contiguous().t(), sl, 512, md, ns, None, True, None),
        (q, k, bt, sl.long(), 512, md, ns, None, True, None),
        (q, k, bt, sl, 576, md, ns, None, True, None),
        (q, k, bt, sl, 512, md[:66], ns, None, True, None),
        (q, k, bt, sl, 512, md, ns.long(), None, True, None),
        (q, k, bt, sl, 512, md, ns, 0.1, True, None),
        (q, k, bt, sl, 512, md, ns, None, False, None),
        (q, k, bt, sl, 512, md, ns, None, True,
         Schedule.build(target="hopper", rows_per_tile=16, block_kv=32)),
    ]
    keys = {api._signature(*v) for v in variants}
    assert key not in keys and len(keys) == len(variants)


def test_strict_mode_host_check_names_the_bad_entry():
    """Strict mode's host check (on CPU tensors here): a used page outside the cache or a
    length beyond the table row is named; an unused bad entry is not an error."""
    from mlagen.backends.hopper import ops

    k = torch.zeros(8, 64, 1, 576, dtype=torch.bfloat16)
    bt = torch.arange(8, dtype=torch.int32).view(2, 4)
    sl = torch.tensor([100, 200], dtype=torch.int32)
    ops.check_indices(k, bt, sl)
    bt[0, 3] = 99                       # sequence 0 uses 2 pages: column 3 is unused
    ops.check_indices(k, bt, sl)
    bt[1, 2] = -1
    with pytest.raises(InputError, match=r"block_table\[1, 2\] = -1"):
        ops.check_indices(k, bt, sl)
    bt[1, 2] = 6
    sl[0] = 4 * 64 + 1
    with pytest.raises(InputError, match=r"cache_seqlens\[0\] = 257"):
        ops.check_indices(k, bt, sl)


@pytest.mark.parametrize("batch,parts,max_c,c", [
    (32, 66, 2, 2),      # b = 32 at h_q = 128: 64 of 66 parts
    (33, 66, 2, 2),
    (34, 66, 2, 1),      # 68 pieces do not fit
    (16, 66, 2, 1),      # 32 pieces: the equal plan cuts shorter ones, the cluster plan never wins
    (32, 132, 2, 1),
    (66, 132, 2, 2),
    (32, 65, 2, 1),      # clusters must divide the parts
    (32, 66, 1, 1),      # a kernel without the merge
])
def test_cluster_size_rule(cpp_plan, batch, parts, max_c, c):
    """sched_cluster: clusters of 2 only where every request gets 2 parts and the cluster
    plan can be taken (fewer than 2 more parts a request), so no launch pays for clusters
    it cannot use."""
    assert cpp_plan.lib.cluster(batch, parts, max_c) == c


@pytest.mark.parametrize("flags,words", [
    (1, ["block_table entry outside"]), (2, ["negative cache_seqlens"]),
    (4, ["metadata planned for another launch"]),
    (5, ["block_table entry outside", "metadata planned for another launch"])])
def test_device_error_flags_are_named(monkeypatch, flags, words):
    """check_device_errors names every flag the kernels set (a CPU tensor standing in for the
    device's), and clears them."""
    from mlagen.backends.hopper import api

    t = torch.tensor([flags], dtype=torch.int32)
    monkeypatch.setattr(api, "device_error_flags", lambda device=None: t)
    with pytest.raises(InputError) as e:
        api.check_device_errors()
    assert all(w in str(e.value) for w in words), str(e.value)
    assert int(t.item()) == 0
    api.check_device_errors()                 # cleared: quiet


@pytest.mark.parametrize("value,on", [(None, True), ("1", True), ("0", False), ("off", None),
                                      ("", None), ("00", None)])
def test_cluster_switch(monkeypatch, value, on):
    """MLAGEN_HOPPER_CLUSTER: 0 or 1, anything else refused naming the variable (the C++
    side reads only "0"; a typo must not silently keep clusters on)."""
    from mlagen.backends.hopper.defaults import cluster_switch

    if value is None:
        monkeypatch.delenv("MLAGEN_HOPPER_CLUSTER", raising=False)
    else:
        monkeypatch.setenv("MLAGEN_HOPPER_CLUSTER", value)
    if on is None:
        with pytest.raises(ScheduleError, match="MLAGEN_HOPPER_CLUSTER|must be 0"):
            cluster_switch()
    else:
        assert cluster_switch() is on
