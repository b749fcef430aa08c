"""(CPU) The Hopper escape classes, drawn per piece: the split kernel runs a piece of a
sequence at a time, so what a fault needs must happen inside one piece, with the split
points the scheduler makes (its Python copy, mlagen/backends/hopper/scheduler.py).

- the max rising past the rescale slack after a piece's first block (the few-rows kernel's
  conditional rescale), on every example schedule of that kernel;
- the larger max in the blocks the second warpgroup takes (odd blocks of a piece), far
  enough above the first's that a merge keeping the first's max overflows;
- a bad table entry on the last page of a piece that is not the sequence's last (the 64-row
  wgmma kernel's check of [first, last] pages of a piece);
- the FP8 caches' scales: tiles of distinct scales (fp8_ds_mla), a descale per sequence
  (fp8_e4m3);
and why random batches miss the first three: the "auto" split of a short batch over the
H200's SMs makes one-block pieces."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import HealthCheck, find, settings

from mlagen import kvformat
from mlagen.backends import backend
from mlagen.backends.hopper import scheduler
from mlagen.paths import SCHEDULES_DIR, TEMPLATES_DIR
from mlagen.schedule import load
from mlagen.verify.strategies import Bounds, Case, cases, family, path_cases

SMALL = Bounds(max_batch=3, max_len=300, long_len=1100, max_extra_table=1)
FIND = settings(database=None, max_examples=400, deadline=None,
                suppress_health_check=list(HealthCheck))
BLOCK = 64
H200_SMS = 132
ROWS1 = ("hopper_wgmma_r16", "hopper_wgmma_r32_fp16", "hopper_fp8_e4m3", "hopper_fp8_ds_mla")
ROWS2 = ("hopper_wgmma_r16_w8", "hopper_wgmma_r32_w8")


def example(name):
    return load(SCHEDULES_DIR / f"{name}.toml")


def slack() -> float:
    text = (TEMPLATES_DIR / "hopper" / "include" / "mla_common.cuh").read_text()
    return float(re.search(r"constexpr float kRescaleSlack = ([0-9.]+)f;", text).group(1))


def scores(inp, b: int, s: int, h: int) -> torch.Tensor:
    """log2-domain scores of query row (s, h) of sequence b over all its keys (-inf past
    the row's causal limit), from the dequantized cache."""
    n = int(inp.cache_seqlens[b])
    page = inp.page_size
    t = torch.arange(n)
    table = inp.meta.get("clean_table", inp.block_table)
    raw = inp.k_cache[table[b, t // page].long(), t % page, 0]
    fmt = kvformat.get(inp.kv)
    if fmt.quantized:
        d = inp.k_descale
        d = None if d is None else d[0 if d.numel() == 1 else b]
        k = kvformat.dequantize(raw, fmt.name, d, inp.dv, torch.float64)
    else:
        k = raw.double()
    x = (k @ inp.q[b, s, h].double()) * inp.softmax_scale * math.log2(math.e)
    if inp.causal:
        x[n - inp.s_q + s + 1:] = -math.inf
    return x


def pieces_of(s, c: Case):
    """(sequence, start, end) of the case's pieces; "auto" with the H200's SM count and
    one CTA an SM (the wgmma kernels' occupancy)."""
    split = s.mapping.split_kv if c.split_kv is None else c.split_kv
    if split != "auto":
        return backend("hopper").verify_pieces(s, list(c.seqlens), split)
    parts = scheduler.num_parts(H200_SMS, c.s_q * c.heads, s.mapping.rows_per_tile)
    meta, ns = scheduler.plan(list(c.seqlens), parts, s.mapping.split_cost)
    return [(p.request, p.start, p.end) for p in scheduler.pieces(list(c.seqlens), meta, ns)]


def piece_block_maxima(x: torch.Tensor, start: int, end: int) -> list[float]:
    return [float(x[i:min(i + BLOCK, end)].max()) for i in range(start, end, BLOCK)]


def moves_inside_a_piece(s, c: Case, by: float) -> bool:
    """Some row's running max (the kernel's: moved only past `by`) moves after the first
    block of one of its pieces."""
    inp = c.inputs()
    for b, a, e in pieces_of(s, c):
        if e - a <= BLOCK:
            continue
        for row in (0, c.s_q - 1):
            x = scores(inp, b, row, 0)
            mx = piece_block_maxima(x, a, e)
            m = mx[0]
            for v in mx[1:]:
                if v > m + by:
                    return True
                m = m if v <= m + by else v
    return False


def second_half_dominates(s, c: Case, by: float = 128.0) -> bool:
    """In some piece, the blocks the second warpgroup takes (odd blocks of the piece) hold
    a score more than `by` log2 units above every score of the first's."""
    inp = c.inputs()
    for b, a, e in pieces_of(s, c):
        if e - a <= BLOCK:
            continue
        x = scores(inp, b, c.s_q - 1, 0)
        mx = piece_block_maxima(x, a, e)
        if max(mx[1::2]) > max(mx[0::2]) + by:
            return True
    return False


# ---------------------------------------------------------------- why random misses ---
def test_auto_split_of_a_drawn_batch_is_one_block_pieces():
    """On the H200 (132 SMs) the auto plan of a few long sequences is pieces of one block:
    no piece holds a second block for a rescale or a second warpgroup."""
    s = example("hopper_wgmma_r16")
    c = Case(s.problem, 3, 2, 16, (1100, 700, 300), 1, False, 0)
    ps = pieces_of(s, c)
    assert len(ps) > 20 and max(e - a for _, a, e in ps) <= BLOCK
    assert not moves_inside_a_piece(s, Case(s.problem, 3, 2, 16, (1100, 700, 300), 1, False,
                                            0, "rising", 1), slack())


# ---------------------------------------------------------------- the max moves ------
@pytest.mark.parametrize("name", ROWS1)
def test_the_max_rises_past_the_slack_inside_a_piece(name):
    """rows_sum_not_rescaled's class: in the path cases of the schedule and of each member
    of its family, and in the drawn cases (the split drawn with the data)."""
    for m in family(example(name)):
        assert any(moves_inside_a_piece(m, c, slack()) for c in path_cases(m)
                   if c.data == "rising" and c.split_kv == 1), m.variant_name()


def whole_pieces(c: Case) -> bool:
    return c.split_kv == 1 and max(c.seqlens) > 3 * BLOCK


def test_the_max_rises_past_the_slack_inside_a_piece_in_drawn_cases():
    s = example("hopper_wgmma_r16")
    c = find(cases(s, SMALL), lambda c: c.data == "rising" and whole_pieces(c)
             and moves_inside_a_piece(s, c, slack()), settings=FIND)
    assert moves_inside_a_piece(s, c, slack())


# ---------------------------------------------------------------- two warpgroups -----
@pytest.mark.parametrize("name", ROWS2)
def test_the_second_warpgroups_half_holds_the_far_larger_max(name):
    """rows_merge_first_max / rows_merge_l_weight's class: keys of a score 2^128 above the
    first warpgroup's in the odd blocks of a piece (a merge keeping the first's max
    overflows), on the schedule (warps 8) and its fp16 twin; drawn too."""
    for m in family(example(name)):
        if m.mapping.warps != 8:
            continue
        assert any(second_half_dominates(m, c) for c in path_cases(m)
                   if c.data == "dominant_odd"), m.variant_name()
    s = example(name)
    c = find(cases(s, SMALL), lambda c: c.data == "dominant_odd" and whole_pieces(c)
             and second_half_dominates(s, c), settings=FIND)
    assert second_half_dominates(s, c)


@pytest.mark.parametrize("name", ROWS2)
def test_both_warpgroups_hold_keys_of_one_piece_on_random_data(name):
    """rows_merge_l_weight on random data: pieces of several blocks, so both warpgroups'
    states are non-empty with distinct maxima when they merge."""
    s = example(name)
    c = next(c for c in path_cases(s) if c.data == "randn" and c.split_kv == 1)
    inp = c.inputs()
    seen = False
    for b, a, e in pieces_of(s, c):
        if e - a > BLOCK:
            mx = piece_block_maxima(scores(inp, b, 0, 0), a, e)
            seen |= max(mx[0::2]) != max(mx[1::2])
    assert seen


# ---------------------------------------------------------------- bad last page ------
@pytest.mark.parametrize("name", ["hopper_wgmma", "hopper_h200", "hopper_wgmma_r16"])
def test_a_bad_entry_on_the_last_page_of_a_split_piece(name):
    """wgmma_bad_page_last's class: a bad entry on the last page of a piece that is not the
    sequence's last page (the piece ends inside the sequence), in the table the kernel
    gets, with the pieces of the case's split from the scheduler's Python copy."""
    s = example(name)
    page = s.problem.page_size
    hits = 0
    for c in path_cases(s):
        if not c.bad_pages or c.split_kv in (None, "auto"):
            continue
        inp = c.inputs()
        ps = pieces_of(s, c)
        for b, j, _ in c.bad_pages:
            if not isinstance(j, int):
                continue
            entry = int(inp.block_table[b, j])
            assert entry < 0 or entry >= inp.k_cache.shape[0]
            need = -(-c.seqlens[b] // page)
            lasts = [(e - 1) // page for r, a, e in ps if r == b and e > a]
            assert j in lasts and j != need - 1 and j != 0
            hits += 1
    assert hits >= 2


# ---------------------------------------------------------------- FP8 scales ---------
def test_ds_mla_path_cases_hold_tiles_of_distinct_scales():
    """A scale read from the wrong 128-column tile changes a token's values only where the
    tiles' scales differ: randn's rarely do (amax / 448 rounds to one power of two), the
    quantizer's edges make tiles 0..2 differ, in half the path cases."""
    s = example("hopper_fp8_ds_mla")
    cs = [c for c in path_cases(s) if c.kv_edges]
    assert len(cs) >= 3
    inp = cs[0].inputs()
    raw = inp.k_cache.view(torch.uint8)
    n = int(inp.cache_seqlens.max())
    b = int(inp.cache_seqlens.argmax())
    t = torch.arange(n)
    tok = raw[inp.block_table[b, t // inp.page_size].long(), t % inp.page_size, 0]
    sc = tok[:, 512:528].contiguous().view(torch.float32)             # [n, 4] tile scales
    assert bool((sc[:, 1] != sc[:, 0]).any()) and bool((sc[:, 3] != sc[:, 2]).any())


def test_e4m3_path_cases_hold_a_descale_per_sequence():
    s = example("hopper_fp8_e4m3")
    cs = [c for c in path_cases(s) if c.descale_per_seq and c.batch >= 2]
    assert cs
    d = cs[0].inputs().k_descale
    assert d.numel() == cs[0].batch and len(set(d.tolist())) > 1


# ---------------------------------------------------------------- through the worker -
def test_the_drawn_split_reaches_the_worker_and_a_whole_piece_fault_is_caught():
    """split_kv is drawn per example and applied in the worker (a runner of the same build
    for schedule.replace(split_kv=...)): a fault that shows only on whole-sequence pieces
    is caught, and its case names the split."""
    from mlagen.verify import verify

    s = example("hopper_wgmma_r16")
    r = verify(s, examples=40, profile="ci", progress=False, isolate=True, device="cpu",
               runner_factory="verify_helpers:wrong_on_whole_pieces_factory",
               bounds=Bounds(max_batch=2, max_len=200, long_len=300, max_extra_table=1),
               shrink_budget_s=5, save_failures=False)
    assert not r.ok and r.failure.kind == "mismatch", r.summary()
    assert r.failure.case_fields["split_kv"] == 1 and "split_kv 1" in r.failure.case


# ---------------------------------------------------------------- parts mid-request --
@pytest.mark.parametrize("name", ["hopper_h200", "hopper_wgmma"])
def test_a_part_starts_inside_a_request_in_the_auto_plan(name):
    """sched_piece_start's class: the auto plan's cost branch, where a part's first piece
    starts inside a request, for the H200's part counts (one or two CTAs an SM)."""
    s = example(name)
    c = next(c for c in path_cases(s) if c.batch >= 33 and c.split_kv is None)
    for ctas in (1, 2):
        parts = scheduler.num_parts(H200_SMS * ctas, c.s_q * c.heads, s.mapping.rows_per_tile)
        lens = list(c.seqlens)
        nblk = [scheduler.blocks(n) for n in lens]
        assert scheduler.equal_piece(nblk, parts) is None or \
            scheduler.equal_piece(nblk, parts) > -(-(sum(nblk) + 5 * len(lens)) // parts) + 5
        meta, _ = scheduler.plan(lens, parts, s.mapping.split_cost)
        assert any(md[1] > 0 for md in meta), (ctas, parts)
