"""(CPU) The strategies draw each input class that let faults escape random data: scores
whose running max moves late by more than the kernels' rescale slack, a dominant key in
the second warpgroup's block (past what a merge keeping the first max survives), pages
larger than the key block with keys at offsets inside them, bad table entries at the
first, middle and last page, heads that leave the last core short, and s_q > length >
block_kv in one draw.  The planted faults of those classes are caught by verify:
test_verify_mutants.py (SC11, here) and its cuda tests (Hopper)."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import HealthCheck, find, settings

from mlagen.paths import SCHEDULES_DIR, TEMPLATES_DIR
from mlagen.reference import run as reference
from mlagen.schedule import load
from mlagen.verify import adversarial
from mlagen.verify.runner import expected_outputs
from mlagen.verify.strategies import (Bounds, Case, cases, family, path_cases,
                                      plant_bad_pages)

SMALL = Bounds(max_batch=3, max_len=300, long_len=1100, max_extra_table=1)
FIND = settings(database=None, max_examples=3000, deadline=None,
                suppress_health_check=list(HealthCheck))
BLOCK = 64


def example(name):
    return load(SCHEDULES_DIR / f"{name}.toml")


def slack() -> float:
    text = (TEMPLATES_DIR / "hopper" / "include" / "mla_common.cuh").read_text()
    return float(re.search(r"constexpr float kRescaleSlack = ([0-9.]+)f;", text).group(1))


def row_scores(inp, b: int, s: int, h: int) -> torch.Tensor:
    """log2-domain scores of query row (s, h) of sequence b over the keys it sees."""
    n = int(inp.cache_seqlens[b])
    lim = n - inp.s_q + s + 1 if inp.causal else n
    page = inp.page_size
    t = torch.arange(max(lim, 0))
    table = inp.meta.get("clean_table", inp.block_table)      # planted bad pages aside
    k = inp.k_cache[table[b, t // page].long(), t % page, 0].double()
    q = inp.q[b, s, h].double()
    return (k @ q) * inp.softmax_scale * math.log2(math.e)


def block_maxima(x: torch.Tensor) -> list[float]:
    return [float(x[i:i + BLOCK].max()) for i in range(0, len(x), BLOCK)]


def late_move(x: torch.Tensor, by: float) -> bool:
    """The running max moves by more than `by` at a block after the second."""
    mx = block_maxima(x)
    run = mx[0]
    for i, v in enumerate(mx[1:], 1):
        if i >= 2 and v > run + by:
            return True
        run = max(run, v)
    return False


# ---------------------------------------------------------------- the max moves late ---
@pytest.mark.parametrize("name", ["hopper_wgmma", "hopper_wgmma_r16", "sc11_attn"])
def test_scores_rise_past_the_slack_at_late_blocks(name):
    s = example(name)
    by = slack()

    def moves(c: Case) -> bool:
        if c.data != "rising" or max(c.seqlens) < 4 * BLOCK:
            return False
        inp = c.inputs()
        b = max(range(c.batch), key=lambda i: c.seqlens[i])
        return late_move(row_scores(inp, b, c.s_q - 1, 0), by)

    c = find(cases(s, SMALL), moves, settings=FIND)
    assert moves(c)


def test_random_data_does_not_move_the_max_late():
    """Why the pattern is needed: on randn the max never moves past the slack late."""
    s = example("hopper_wgmma")
    c = Case(s.problem, 1, 1, 4, (1000,), 3, False, 0)
    inp = c.inputs()
    assert not any(late_move(row_scores(inp, 0, 0, h), slack()) for h in range(4))


# ---------------------------------------------------------------- two warpgroups ------
def test_a_dominant_key_in_the_second_warpgroups_block_beats_the_first_by_2_pow_128():
    """The few-rows kernel with warps = 8: WG0 takes even blocks, WG1 odd ones.  A merge
    that keeps WG0's max overflows (2^(m1 - m0) > 2^128) when WG1 holds a key that far
    above: the dominant pattern draws one."""
    s = example("hopper_wgmma_r16_w8")

    def beats(c: Case) -> bool:
        if c.data != "dominant":
            return False
        inp = c.inputs()
        for b, n in enumerate(c.seqlens):
            if n <= BLOCK or n < c.s_q:
                continue
            mx = block_maxima(row_scores(inp, b, c.s_q - 1, 0))
            even, odd = max(mx[0::2]), max(mx[1::2], default=-math.inf)
            if odd > even + 128:
                return True
        return False

    c = find(cases(s, SMALL), beats, settings=FIND)
    assert beats(c)


# ---------------------------------------------------------------- pages and blocks ----
@pytest.mark.parametrize("name", ["hopper_wgmma", "hopper_wgmma_r16", "hopper_h200"])
def test_pages_larger_than_the_block_with_keys_inside_them(name):
    """A page of 128+ tokens holding a block that starts at offset 64 of it (the second
    block of a page), and more: wgmma schedules ship pages of 64 only."""
    s = example(name)
    assert s.problem.page_size == 64

    def inside(c: Case) -> bool:
        return c.problem.page_size > 64 and any(n > 64 + BLOCK for n in c.seqlens)

    c = find(cases(s, SMALL), inside, settings=FIND)
    assert inside(c) and c.inputs().page_size > 64


def test_head_counts_around_the_tile_rows_are_drawn():
    s = example("hopper_wgmma_r16")
    seen = set()
    find(cases(s, SMALL), lambda c: seen.add(c.heads) or len(seen) >= 5, settings=FIND)
    assert {1, 15, 16} <= seen or len(seen) >= 5


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_bad_pages_at_the_first_middle_and_last_page(where):
    s = example("hopper_wgmma")

    def bad(c: Case) -> bool:
        return any(w == where and -(-c.seqlens[b] // c.problem.page_size) >= 3
                   for b, w, _ in c.bad_pages)

    c = find(cases(s, SMALL), bad, settings=FIND)
    inp = c.inputs()
    b, w, past = next(x for x in c.bad_pages if x[1] == where)
    need = -(-c.seqlens[b] // c.problem.page_size)
    j = {"first": 0, "middle": need // 2, "last": need - 1}[where]
    entry = int(inp.block_table[b, j])
    assert entry < 0 or entry >= inp.k_cache.shape[0]
    assert inp.meta["bad_sequences"] and b in inp.meta["bad_sequences"]


def test_a_bad_page_sequence_is_expected_nan_and_the_rest_exact():
    s = example("hopper_h200")
    c = Case(s.problem, 3, 2, 4, (200, 70, 129), 5, False, 0, "rising", 3,
             ((0, "last", True), (2, "middle", False)))
    inp = c.inputs()
    want = expected_outputs(lambda i, dtype: reference(i, dtype), inp)
    clean = reference(c.clean_inputs(), torch.float64)
    for b in (0, 2):
        assert torch.isnan(want.out[b]).all() and torch.isnan(want.lse[b]).all()
    assert torch.equal(want.out[1], clean.out[1]) and torch.isfinite(want.out[1]).all()
    # the kernel's inputs hold the bad entries, the reference's do not
    assert int(inp.block_table[0, 3]) == inp.k_cache.shape[0]
    assert torch.equal(c.clean_inputs().block_table, inp.meta["clean_table"])


def test_path_cases_plant_bad_pages_where_the_contract_makes_them_nan():
    hop = path_cases(example("hopper_wgmma"))
    assert any(("last" in [w for _, w, _ in c.bad_pages]) for c in hop)
    assert not any(c.bad_pages for c in path_cases(example("sc11_attn")))
    assert {c.problem.page_size for c in hop} >= {64, 128, 256}


def test_hopper_path_cases_put_rows_that_see_no_key_through_the_combine():
    """A causal row that sees no key, in a request cut into forced pieces: only the combine
    makes its lse +inf (a combine that left it at -inf escaped the drawn examples)."""
    s = example("hopper_h200")
    forced = [c for c in path_cases(s) if c.split_kv not in (None, 1, "auto")]
    assert s.problem.causal
    assert any(c.causal is not False and any(0 < n < c.s_q for n in c.seqlens)
               for c in forced)
    assert any(0 in c.seqlens for c in forced)


@pytest.mark.parametrize("name", ["hopper_fp8_e4m3_regs", "sc11_attn"])
def test_path_cases_hold_query_rows_twelve_binades_apart(name):
    """q_spread: each query row scaled by its own power of two, the cache untouched; a path
    case of every attention-only schedule (the register-conversion FP8 kernel scales each
    row into fp16 and back: another row's scale there is a wrong answer)."""
    s = example(name)
    spread = [c for c in path_cases(s) if c.data == "q_spread"]
    assert len(spread) == 1
    c = spread[0]
    plain = Case(**{**c.__dict__, "data": "randn"}).inputs()
    inp = c.inputs()
    assert torch.equal(inp.k_cache.view(torch.uint8), plain.k_cache.view(torch.uint8))
    ratio = inp.q.double() / plain.q.double()
    per_row = ratio.flatten(0, 2).nan_to_num(1.0)
    row_f = per_row.max(dim=1).values
    assert torch.equal(per_row.min(dim=1).values, row_f)      # one factor a row
    exps = torch.log2(row_f)
    assert torch.equal(exps, exps.round()) and float(exps.min()) <= -8 and float(exps.max()) == 0
    assert len(set(exps.tolist())) >= min(8, row_f.numel())


def test_q_spread_leaves_the_fused_operator_alone():
    s = example("sc11_fused_tp4")
    assert not [c for c in path_cases(s) if c.data == "q_spread"]
    c = path_cases(s)[0]
    inp = Case(**{**c.__dict__, "data": "randn"}).inputs()
    assert adversarial.apply(inp, "q_spread", 3) is inp


# ---------------------------------------------------------------- SC11's two ---------
def test_sc11_family_has_heads_that_leave_the_last_core_short():
    """(a) a head count with a remainder of 2+ over the cores: 11 heads over 4 cores
    (3, 3, 3, 2) and 6 over 8, beside the example's 16 over 8."""
    from mlagen.backends.sc11.resources import sc11_heads_per_core

    fam = family(example("sc11_attn"))
    shapes = {(m.heads_per_device, m.mapping.cores, sc11_heads_per_core(m)) for m in fam}
    assert any(h % c >= 2 and h % hpc for h, c, hpc in shapes), shapes
    assert (16, 8, 2) in shapes


def test_sc11_draws_s_q_above_a_length_above_block_kv_in_one_case():
    """(b) a split sequence with a query row that sees no key: s_q > length > block_kv,
    from one draw of the family member whose block is below s_q."""
    fam = family(example("sc11_attn"))
    m = next(x for x in fam if x.mapping.block_kv < x.problem.max_s_q - 1)

    def both(c: Case) -> bool:
        return any(m.mapping.block_kv < n < c.s_q for n in c.seqlens)

    c = find(cases(m, SMALL), both, settings=FIND)
    assert both(c)
    assert any(m.mapping.block_kv < n < c.s_q for c in path_cases(m) for n in c.seqlens
               if c.s_q == m.problem.max_s_q)


# ---------------------------------------------------------------- the patterns -------
@pytest.mark.parametrize("pattern", adversarial.PATTERNS + adversarial.PIECE_PATTERNS)
def test_patterns_keep_tensors_finite_and_the_reference_finite(pattern):
    s = example("sc11_attn")
    c = Case(s.problem, 2, 2, 16, (300, 65), 1, True, 1, pattern, 9)
    inp = c.inputs()
    want = reference(inp, torch.float64)
    assert torch.isfinite(want.out).all() and torch.isfinite(want.lse).all()
    assert not inp.q.is_contiguous()          # a strided q stays strided
    if pattern == "ties":
        k = row_scores(inp, 0, 1, 3)
        assert torch.allclose(k, k[0].expand_as(k))
    if pattern == "very_large":
        assert float(want.lse.min()) > 500
    if pattern == "very_negative":
        assert float(want.lse.max()) < -500


def test_fused_patterns_shape_the_keys():
    s = example("sc11_fused_tp4")
    base = Case(s.problem, 1, 1, s.heads_per_device, (200,), 2, False, 0)
    rising = Case(s.problem, 1, 1, s.heads_per_device, (200,), 2, False, 0, "rising", 3)
    a, b = base.inputs(), rising.inputs()
    tail = slice(512, None)
    grow = (b.k_cache[..., tail].float().abs().nansum() / a.k_cache[..., tail].float().abs()
            .nansum())
    assert grow > 2
    assert torch.isfinite(reference(b, torch.float64).lse).all()


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_e4m3"])
def test_a_quantized_cache_is_shaped_as_values_and_stored_again(fmt):
    """A KV format plugs in through mlagen.kvformat: the pattern shapes the dequantized
    values, the cache is quantized again, and the reference (which dequantizes) sees it."""
    import dataclasses

    from mlagen import kvformat

    s = example("sc11_attn")
    prob = dataclasses.replace(s.problem, kv_format=fmt)
    c = Case(prob, 2, 1, 4, (300, 130), 1, False, 0, "rising", 2)
    inp = c.inputs()
    assert inp.k_cache.element_size() == 1 and kvformat.get(fmt).quantized
    plain = Case(prob, 2, 1, 4, (300, 130), 1, False, 0).inputs()
    assert not torch.equal(inp.k_cache.view(torch.uint8), plain.k_cache.view(torch.uint8))
    want = reference(inp, torch.float64)
    assert torch.isfinite(want.lse).all() and torch.isfinite(want.out).all()
    rise = float(want.lse[0].max()) - float(reference(plain, torch.float64).lse[0].max())
    # fp8_ds_mla keeps rope in bf16 (the ramp's column): the full rise; e4m3 saturates at
    # 448 x descale, so its ramp is cut there
    assert rise > (5 if fmt == "fp8_ds_mla" else 0.1), rise
