"""Hypothesis strategies for token-sparse problems (attention = "sparse"), target-independent.

sparse_cases(schedule)  -> SparseCase  what a drawn sparse problem is: batch, s_q, sequence
                                       lengths of each pool, topk entries per row with
                                       invalid (-1) and repeated entries, topk_length (0
                                       included), rows whose every entry is invalid, windows
                                       of consecutive slots (runs, some across a page), sinks
                                       (finite or +-inf), an adversarial score pattern
sparse_path_cases(s)    -> [SparseCase] fixed cases that take every run-time branch at once

SparseCase.inputs() makes the tensors (mlagen.problem.make_sparse_inputs, a drawn seed) and
then writes NaN into every cache slot no valid index names, so a kernel that reads one
shows NaN.  A backend adds nothing here: what its build compiles in (topk, page sizes,
formats, sinks) comes from the schedule; the run-time shapes (batch, s_q, lengths) are
drawn.  mlagen.verify.strategies.cases hands a sparse schedule to sparse_cases.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
from hypothesis import strategies as st

from .. import kvformat
from ..problem import SparseInputs, make_sparse_inputs
from ..schedule.records import Problem
from . import adversarial
from .profiles import Bounds


def nan_unnamed(inp: SparseInputs, rank: int) -> SparseInputs:
    """Every slot of every pool that no valid entry of any row names set to NaN (in its
    format: e4m3 NaN bytes, NaN rope values), in place; returns inp."""
    b_n, s_n = inp.rows
    w = inp.weights
    d = inp.q.shape[-1] if inp.q is not None else rank + w.w_uq.shape[-1] - w.w_uk.shape[1]
    for pool in inp.pools:
        c = pool.k_cache
        slots = c.shape[0] * c.shape[1]
        named = torch.zeros(slots, dtype=torch.bool)
        for b in range(b_n):
            for s in range(s_n):
                named[adversarial._named(pool, b, s)] = True
        fmt = kvformat.get(pool.kv_format or "bf16")
        if fmt.paged:   # a slot's bytes are two rows of its page: data, then scales
            data, scales = kvformat.paged_rows(c, rank)     # views, written in place
            off = ~named.view(c.shape[0], c.shape[1])
            data[off, :rank] = 0x7F                 # e4m3 NaN
            data[off, rank + 1::2] = 0x7F           # rope: bf16 0x7FC0, NaN
            data[off, rank::2] = 0xC0
            scales[off, :-1] = 0xFF                 # UE8M0 NaN
            continue
        flat = c.view(slots, c.shape[-1])
        if not fmt.quantized:
            flat[~named] = float("nan")
            continue
        raw = c.view(torch.uint8).view(slots, c.shape[-1])
        raw[~named] = 0x7F                     # e4m3 NaN (and absurd scales)
        rope = c.shape[-1] - 2 * (d - rank)
        raw[~named, rope + 1::2] = 0x7F        # rope: bf16 0x7FC0, NaN
        raw[~named, rope::2] = 0xC0
    return inp


def nan_named(inp: SparseInputs, rank: int) -> SparseInputs:
    """A NaN in the first slot row (0, 0) names in each pool, in place: 16-bit caches a
    value, 8-bit ones the e4m3 byte 2 of the latent (a 4-byte word's upper half, which a
    converter handles apart from the lower), so that row's output is NaN; returns inp."""
    for pool in inp.pools:
        slots = adversarial._named(pool, 0, 0)
        if not slots.numel():
            continue
        slot = int(slots[0])
        c = pool.k_cache
        page = c.shape[1]
        fmt = kvformat.get(pool.kv_format or "bf16")
        if fmt.paged:
            data, _ = kvformat.paged_rows(c, rank)
            data[slot // page, slot % page, 2] = 0x7F
        elif fmt.quantized:
            c.view(torch.uint8)[slot // page, slot % page, 0, 2] = 0x7F
        else:
            c[slot // page, slot % page, 0, 3] = float("nan")
    return inp


@dataclass(frozen=True)
class SparseCase:
    """One drawn sparse problem; `inputs()` makes its tensors."""

    problem: Problem
    batch: int
    s_q: int
    heads: int
    seqlens: tuple[int, ...]                 # the main pool's sequences
    extra_seqlens: tuple[int, ...]           # the extra pool's (extra_topk > 0)
    seed: int
    invalid: float = 0.0                     # share of entries set to -1
    repeats: float = 0.0                     # share of entries repeating another
    topk_length: bool = False                # a drawn topk_length per batch row
    zero_length: tuple[int, ...] = ()        # batch rows whose topk_length is 0
    long_length: tuple[int, ...] = ()        # batch rows whose topk_length passes the list's
    empty_rows: tuple[tuple[int, int], ...] = ()   # (b, s) rows with every entry -1
    infinite_sinks: bool = False             # sinks: the first head +inf, the last -inf
    windows: bool = False                    # lists of consecutive-slot windows (runs)
    data: str = "randn"                      # adversarial.PATTERNS
    data_arg: int = 0
    nan_named: bool = False                  # a NaN in a slot row (0, 0) names (nan_named())
    split_kv = None                          # the schedule's own split (strategies.Case's knob)

    def clean_inputs(self) -> SparseInputs:
        p = self.problem
        inp = make_sparse_inputs(p, self.batch, list(self.seqlens), s_q=self.s_q,
                                 heads=self.heads, seed=self.seed,
                                 extra_seqlens=list(self.extra_seqlens) or None,
                                 invalid=self.invalid, repeats=self.repeats,
                                 topk_length=(self.topk_length or bool(self.zero_length)
                                              or bool(self.long_length)),
                                 infinite_sinks=self.infinite_sinks, windows=self.windows)
        pools = []
        for pool in inp.pools:
            idx = pool.indices.clone()
            for b, s in self.empty_rows:
                idx[b, s] = -1
            tl = pool.topk_length
            if self.zero_length or self.long_length:
                tl = tl.clone()
                tl[list(self.zero_length)] = 0
                # past the list's end by 1 and more: the kernel keeps the whole list
                for r in self.long_length:
                    tl[r] = idx.shape[-1] + 1 + r
            pools.append(dataclasses.replace(pool, indices=idx, topk_length=tl))
        inp = dataclasses.replace(inp, pools=pools)
        inp = adversarial.apply_sparse(inp, self.data, self.data_arg, p.kv_lora_rank)
        inp = nan_unnamed(inp, p.kv_lora_rank)
        if self.nan_named:
            inp = nan_named(inp, p.kv_lora_rank)
        inp.meta.update(self.fields())
        return inp

    def inputs(self) -> SparseInputs:
        return self.clean_inputs()

    def fields(self) -> dict:
        """The case as plain values (a repro file's record)."""
        return dict(batch=self.batch, s_q=self.s_q, heads=self.heads,
                    seqlens=list(self.seqlens), extra_seqlens=list(self.extra_seqlens),
                    seed=self.seed, invalid=self.invalid, repeats=self.repeats,
                    topk_length=self.topk_length, zero_length=list(self.zero_length),
                    long_length=list(self.long_length),
                    empty_rows=[list(r) for r in self.empty_rows],
                    infinite_sinks=self.infinite_sinks, windows=self.windows, data=self.data,
                    data_arg=self.data_arg, nan_named=self.nan_named,
                    dtype=self.problem.dtype,
                    page_size=self.problem.page_size)

    def describe(self) -> str:
        p = self.problem
        return (f"sparse: batch {self.batch}, s_q {self.s_q}, heads {self.heads}, topk "
                f"{p.topk} (page {p.page_size}, {p.kv}), seqlens {list(self.seqlens)}"
                + (f", extra pool topk {p.extra_topk} (page {p.extra_page_size or p.page_size}"
                   f") seqlens {list(self.extra_seqlens)}" if p.extra_topk else "")
                + f", seed {self.seed}"
                + (f", invalid {self.invalid}" if self.invalid else "")
                + (f", repeats {self.repeats}" if self.repeats else "")
                + (", topk_length drawn" if self.topk_length else "")
                + (f", topk_length 0 at rows {list(self.zero_length)}" if self.zero_length
                   else "")
                + (f", topk_length past topk at rows {list(self.long_length)}"
                   if self.long_length else "")
                + (f", every entry invalid at {list(self.empty_rows)}" if self.empty_rows
                   else "")
                + (", sinks +inf / -inf" if self.infinite_sinks else "")
                + (", windows of consecutive slots" if self.windows else "")
                + (f", data {self.data} ({self.data_arg})" if self.data != "randn" else "")
                + (", a NaN in a slot row (0, 0) names" if self.nan_named else ""))


def _lengths(topk: int, bounds: Bounds) -> st.SearchStrategy:
    """A pool's sequence length: 0, below, at and past topk (so lists hold -1 past it)."""
    hi = max(1, min(bounds.long_len, 2 * topk + 3))
    return st.one_of(st.integers(0, hi), st.sampled_from(sorted({0, 1, max(0, topk - 1),
                                                                 topk, topk + 1} )))


@st.composite
def sparse_cases(draw, spec, bounds: Bounds = Bounds(), heads: Optional[int] = None,
                 patterns=adversarial.PATTERNS) -> SparseCase:
    """A SparseCase for a schedule (or a bare Problem) with attention = "sparse"."""
    prob = spec.problem if hasattr(spec, "problem") else spec
    h = heads or (spec.heads_per_device if hasattr(spec, "heads_per_device")
                  else prob.heads)
    if hasattr(spec, "target"):
        # what the target's build leaves to run time: the backend's run-time shapes (heads,
        # page size), and topk where it does not change the build (the variant name)
        from ..backends import backend

        shapes = backend(spec.target.kind).runtime_shapes(spec)
        if heads is None and shapes.get("heads"):
            h = draw(st.sampled_from(shapes["heads"]))
        if shapes.get("page_size"):
            prob = dataclasses.replace(prob, page_size=draw(st.sampled_from(
                shapes["page_size"])))
        name = spec.variant_name()
        topks = [k for k in dict.fromkeys((prob.topk, 1, 63, 64, 65, 200))
                 if spec.replace(topk=k).variant_name() == name]
        prob = dataclasses.replace(prob, topk=draw(st.sampled_from(topks)))
    batch = draw(st.integers(1, bounds.max_batch))
    s_q = draw(st.integers(1, prob.max_s_q))
    lens = draw(st.lists(_lengths(prob.topk, bounds), min_size=batch, max_size=batch))
    extra = draw(st.lists(_lengths(prob.extra_topk, bounds), min_size=batch,
                          max_size=batch)) if prob.extra_topk else []
    seed = draw(st.integers(0, 2**31 - 1))
    invalid = draw(st.sampled_from((0.0, 0.2, 0.6, 1.0)))
    repeats = draw(st.sampled_from((0.0, 0.3)))
    topk_length = draw(st.booleans())
    zero = tuple(sorted(draw(st.sets(st.integers(0, batch - 1), max_size=1))))
    rows = [(b, s) for b in range(batch) for s in range(s_q)]
    empty = tuple(sorted(draw(st.sets(st.sampled_from(rows), max_size=2))))
    inf_sinks = draw(st.booleans()) if prob.sinks else False
    data = draw(st.sampled_from(tuple(patterns))) if patterns else "randn"
    arg = draw(st.integers(0, 63)) if data != "randn" else 0
    # windows: runs of adjacent slots (cut by -1, repeats, topk_length and page edges) in
    # half the cases; taken from the seed's parity, not a draw of its own, so the other
    # fields' draws (and the tests' cases) stay as they were
    windows = bool(seed & 1)
    # likewise a row whose topk_length passes its list (clipped: the whole list) in a
    # quarter of the cases that draw lengths
    r = (seed >> 3) % batch
    long = (r,) if topk_length and (seed >> 1) & 3 == 0 and r not in zero else ()
    return SparseCase(prob, batch, s_q, h, tuple(lens), tuple(extra), seed, invalid,
                      repeats, topk_length, zero, long, empty, inf_sinks, windows, data,
                      arg)


def sparse_path_cases(s, bounds: Bounds = Bounds()) -> list[SparseCase]:
    """Fixed cases that take a sparse kernel's run-time branches at once: lists shorter
    and longer than topk, invalid and repeated entries, topk_length (with a 0 and one past
    the list), a row with every entry invalid, +-inf sinks, rising and dominant scores,
    windows of adjacent slots (runs across pages, cut by -1, repeats and topk_length)."""
    p = s.problem
    h = s.heads_per_device
    sq = p.max_s_q
    cap = bounds.long_len
    tk, xk = p.topk, p.extra_topk
    # sequences shorter than, as long as and longer than a list (a list costs topk entries
    # whatever the sequence, so these are not held to the bounds' lengths)
    lens = (0, 1, min(cap, max(1, tk // 2)), tk + 3, 2 * tk + 1)
    xl = (xk + 2, 3, 0, xk, 1) if xk else ()
    b = len(lens)
    full = (tk + 1, 2 * tk, tk)              # every entry valid: topk_length decides
    return [
        SparseCase(p, b, sq, h, lens, xl, 1, invalid=0.2, repeats=0.3, topk_length=True,
                   zero_length=(1,), empty_rows=((2, sq - 1),), infinite_sinks=p.sinks,
                   data="rising", data_arg=2),
        SparseCase(p, 3, sq, h, full, xl[:3], 2, topk_length=True, zero_length=(2,),
                   long_length=(0,)),
        SparseCase(p, b, sq, h, lens, xl, 3, data="dominant", data_arg=5),
        SparseCase(p, 2, 1, h, lens[-2:], xl[-2:], 4, invalid=0.6, data="very_large"),
        SparseCase(p, 1, sq, h, lens[-1:], xl[:1], 5, invalid=1.0),
        SparseCase(p, b, sq, h, lens, xl, 6, invalid=0.1, repeats=0.1, topk_length=True,
                   windows=True),
        SparseCase(p, 3, sq, h, full, xl[:3], 7, windows=True, data="rising", data_arg=3),
        # a NaN in a named slot (a NaN byte in a word's upper half, for 8-bit caches)
        SparseCase(p, 2, sq, h, lens[-2:], xl[-2:], 8, nan_named=True),
    ]
