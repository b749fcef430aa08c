"""Strategies: what they draw is a valid, adversarial MLA problem, and legal schedules."""

import math

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings

from mlagen.schedule.records import Problem, Schedule
from mlagen.schedule.rules import check
from mlagen.verify.strategies import (COMPILE_KNOBS, Bounds, cases, default_base, legal,
                                      problems, schedules)

SMALL = Bounds(max_batch=3, max_len=150, long_len=600, max_extra_table=2)
FAST = settings(max_examples=40, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
SC11 = default_base("sc11")


def check_inputs(inp, heads, page, max_s_q, dtype):
    b = inp.batch
    assert inp.q.shape[0] == b and inp.q.shape[2] == heads and inp.q.shape[3] == 576
    assert 1 <= inp.s_q <= max_s_q
    assert inp.q.dtype == dtype and inp.k_cache.dtype == dtype
    assert inp.page_size == page
    assert inp.block_table.dtype == torch.int32 and inp.cache_seqlens.dtype == torch.int32
    assert torch.isfinite(inp.q.float()).all()
    for i in range(b):
        n = int(inp.cache_seqlens[i])
        need = max(1, math.ceil(n / page))
        assert inp.block_table.shape[1] >= need
        used = inp.k_cache[inp.block_table[i, :need].long()].reshape(-1, 576)
        assert torch.isfinite(used[:n].float()).all(), "a used slot holds NaN"
        assert torch.isnan(used[n:].float()).all(), "the last page's tail must be NaN"
        for p in inp.block_table[i, need:].tolist():          # unused entries: NaN pages
            assert torch.isnan(inp.k_cache[p].float()).all()


@FAST
@given(inp=problems(SC11, SMALL))
def test_schedule_problems_are_valid_and_poisoned(inp):
    check_inputs(inp, SC11.heads_per_device, SC11.problem.page_size, SC11.problem.max_s_q,
                 torch.bfloat16)


@FAST
@given(case=cases(Problem(max_s_q=4), SMALL))
def test_free_problem_draws_heads_page_and_dtype(case):
    inp = case.inputs()
    check_inputs(inp, case.heads, case.problem.page_size, 4,
                 {"bf16": torch.bfloat16, "fp16": torch.float16}[case.problem.dtype])
    assert case.problem.page_size in (1, 16, 64) and case.heads in (1, 2, 3, 8, 16)


def test_inputs_are_reproducible_from_the_case():
    c = find(cases(SC11, SMALL), lambda c: sum(c.seqlens) > 10)
    a, b = c.inputs(), c.inputs()
    assert torch.equal(a.q, b.q) and torch.equal(a.block_table, b.block_table)
    assert torch.equal(a.k_cache.nan_to_num(7.0), b.k_cache.nan_to_num(7.0))


@pytest.mark.parametrize("want", ["zero", "one", "page-1", "page+1", "pages", "tile edge",
                                  "strided q", "wide table", "s_q > len", "batch 3"])
def test_edges_are_reachable(want):
    page, tile = SC11.problem.page_size, SC11.mapping.seq_tile
    pred = {
        "zero": lambda c: 0 in c.seqlens,
        "one": lambda c: 1 in c.seqlens,
        "page-1": lambda c: page - 1 in c.seqlens,
        "page+1": lambda c: page + 1 in c.seqlens,
        "pages": lambda c: any(s >= 3 * page and s % page == 0 for s in c.seqlens),
        "tile edge": lambda c: any(s in (tile - 1, tile + 1) for s in c.seqlens),
        "strided q": lambda c: c.q_noncontiguous,
        "wide table": lambda c: c.extra_table > 0,
        "s_q > len": lambda c: any(s < c.s_q for s in c.seqlens),
        "batch 3": lambda c: c.batch == 3,
    }[want]
    c = find(cases(SC11, SMALL), pred, settings=settings(database=None, max_examples=2000))
    assert pred(c)
    if want == "strided q":
        assert not c.inputs().q.is_contiguous()


def test_fused_problem_draws_projection_inputs():
    s = Schedule.build(target="sc11", heads=128, tp=8, fused=True, page_size=16,
                       seq_tile=512)
    c = find(cases(s, SMALL), lambda c: c.batch >= 2)
    inp = c.inputs()
    assert inp.q is None and inp.q_lora.shape[:2] == (c.batch, c.s_q)
    assert inp.weights.w_uk.shape[0] == 16


@FAST
@given(s=schedules("sc11"))
def test_drawn_sc11_schedules_are_legal_neighbours(s):
    check(s)                                    # raises if illegal
    base = default_base("sc11")
    def knob(sc, k):
        return getattr(sc.mapping, k) if hasattr(sc.mapping, k) else getattr(sc.problem, k)

    changed = [k for k in COMPILE_KNOBS["sc11"] if knob(s, k) != knob(base, k)]
    assert len(changed) <= 1


@FAST
@given(s=schedules("hopper", neighbourhood=False))
def test_drawn_hopper_schedules_are_legal(s):
    check(s)
    assert s.mapping.block_kv in (16, 32, 64)


def test_schedule_draws_cover_run_time_knobs():
    for scheme in ("heads", "batch", "seq", "batch_seq"):
        s = find(schedules("sc11"), lambda s: s.mapping.scheme == scheme,
                 settings=settings(database=None, max_examples=500))
        assert s.mapping.scheme == scheme


def test_illegal_draws_are_rejected_not_failed():
    # 128 heads on one card: heads_per_core 1, 2 or 4 would need 128, 64 or 32 cores, and
    # large tiles blow LMEM; such draws must be filtered (assume), and what comes out is legal
    big = Schedule.build(target="sc11", heads=128, tp=1, seq_tile=512, max_s_q=2)
    assert not legal(big.replace(seq_tile=1000))          # not a multiple of block_kv
    seen = []

    @settings(max_examples=30, database=None, deadline=None,
              suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
    @given(s=schedules("sc11", base=big, neighbourhood=False))
    def t(s):
        assert legal(s)
        seen.append(s)

    t()
    assert seen


def test_neighbourhood_keeps_builds_few():
    variants = set()

    @settings(max_examples=300, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(s=schedules("sc11"))
    def t(s):
        variants.add(s.replace(scheme="auto", softmax_scale=None))   # run-time knobs

    t()
    bound = 1 + sum(len(v) for v in COMPILE_KNOBS["sc11"].values())
    assert 1 < len(variants) <= bound


def test_base_for_the_wrong_target_is_an_error():
    with pytest.raises(ValueError, match="base schedule"):
        find(schedules("hopper", base=SC11), lambda s: True)
