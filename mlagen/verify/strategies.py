"""Hypothesis strategies: MLA decode problems and schedules.

problems(spec)        -> MlaInputs   batch, s_q, heads, sequence lengths chosen to sit on the
                                     edges kernels get wrong (0, 1, page +- 1, whole pages,
                                     across KV tiles), shuffled block tables whose unused
                                     entries point at NaN pages, NaN page tails, strided q
schedules(target)     -> Schedule    knobs the target allows, illegal draws rejected with
                                     assume(False) through the same rules a file goes through

Tensors come from mlagen.problem.make_inputs with a drawn seed, so hypothesis shrinks the
shape of a case (fewer, shorter sequences) and its data (seed towards 0) alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
from hypothesis import assume
from hypothesis import strategies as st

from .. import kvformat
from ..errors import ScheduleError
from ..problem import MlaInputs, make_inputs
from ..backends import all_backends, backend
from ..schedule.records import DTYPES, Problem, Schedule
from .profiles import Bounds  # noqa: F401  (defined beside the profiles; re-exported here)


# ---------------------------------------------------------------- problems ---------
@dataclass(frozen=True)
class Case:
    """The drawn description of one problem; `inputs()` makes its tensors."""

    problem: Problem
    batch: int
    s_q: int
    heads: int
    seqlens: tuple[int, ...]
    seed: int
    q_noncontiguous: bool
    extra_table: int
    kv_edges: bool = False          # 8-bit caches: the quantizer's edge cases in the tokens
    descale_per_seq: bool = False   # fp8_e4m3: one k_descale per sequence, not one

    def inputs(self) -> MlaInputs:
        inp = make_inputs(self.problem, self.batch, list(self.seqlens), s_q=self.s_q,
                          heads=self.heads, seed=self.seed, shuffle=True, nan_fill=True,
                          q_noncontiguous=self.q_noncontiguous, kv_edges=self.kv_edges,
                          descale_per_seq=self.descale_per_seq)
        if self.extra_table:
            inp = widen_table(inp, self.extra_table, self.seed)
        inp.meta.update(q_noncontiguous=self.q_noncontiguous, extra_table=self.extra_table,
                        fused=self.problem.fused)
        return inp

    def describe(self) -> str:
        return (f"batch {self.batch}, s_q {self.s_q}, heads {self.heads}, "
                f"page {self.problem.page_size}, {self.problem.dtype}, seqlens "
                f"{list(self.seqlens)}, seed {self.seed}"
                + (", strided q" if self.q_noncontiguous else "")
                + (f", +{self.extra_table} table columns" if self.extra_table else "")
                + (f", KV {self.problem.kv}" if self.problem.kv != self.problem.dtype else "")
                + (", quantizer edges" if self.kv_edges else "")
                + (", descale per sequence" if self.descale_per_seq else ""))


def widen_table(inp: MlaInputs, extra: int, seed: int) -> MlaInputs:
    """Add block-table columns that point at pages no sequence owns (NaN-filled), as a real
    allocator's stale entries would; a kernel that reads past a sequence's pages sees NaN."""
    table = inp.block_table
    lens = inp.cache_seqlens.tolist()
    page = inp.page_size
    owned = set()
    for i, s in enumerate(lens):
        need = max(1, -(-s // page))
        owned.update(table[i, :need].tolist())
    spare = [p for p in range(inp.k_cache.shape[0]) if p not in owned]
    assert spare, "make_paged_cache leaves spare pages"
    g = torch.Generator().manual_seed(seed + 1)
    pick = torch.tensor(spare, dtype=torch.int32)[
        torch.randint(len(spare), (table.shape[0], extra), generator=g)]
    return dataclasses.replace(inp, block_table=torch.cat([table, pick], dim=1).contiguous())


def seqlen_strategy(page: int, bounds: Bounds, tile: Optional[int] = None) -> st.SearchStrategy:
    """One sequence length, weighted towards the edges of pages and tiles."""
    edges = sorted({0, 1, page - 1, page, page + 1, 2 * page - 1, 2 * page, 2 * page + 1}
                   - {-1})
    edges = [e for e in edges if 0 <= e <= bounds.long_len]
    # plain integers first: hypothesis shrinks towards the first branch, where a failing
    # length can shrink to its exact threshold; the other branches aim at the edges
    choices = [st.integers(0, bounds.max_len),
               st.sampled_from(edges),
               st.integers(1, max(1, bounds.max_len // page)).map(lambda k: k * page)]
    long_lo = min(bounds.max_len + 1, bounds.long_len)
    if bounds.long_len > bounds.max_len:
        choices.append(st.integers(long_lo, bounds.long_len))
    if tile and tile <= bounds.long_len:
        # around every multiple of the KV tile that fits: where buffers change hands
        tiles = [k * tile + off for k in range(1, bounds.long_len // tile + 1)
                 for off in (-1, 0, 1) if 0 <= k * tile + off <= bounds.long_len]
        choices.append(st.sampled_from(tiles))
    return st.one_of(*choices)


def _problem_of(spec: Union[Schedule, Problem]) -> Problem:
    return spec.problem if isinstance(spec, Schedule) else spec


@st.composite
def cases(draw, spec: Union[Schedule, Problem], bounds: Bounds = Bounds(),
          heads: Optional[int] = None, page_sizes: Sequence[int] = (1, 16, 64),
          dtypes: Sequence[str] = DTYPES, head_counts: Sequence[int] = (1, 2, 3, 8, 16)
          ) -> Case:
    """A Case for a schedule (heads, page size and dtype fixed: they are compiled in) or for
    a bare Problem (heads, page size and dtype drawn)."""
    prob = _problem_of(spec)
    if isinstance(spec, Schedule):
        h = heads or spec.heads_per_device
        tile = backend(spec.target.kind).boundary_tile(spec)
    else:
        h = heads or draw(st.sampled_from([c for c in head_counts if c <= prob.heads]
                                          or [prob.heads]))
        prob = dataclasses.replace(prob, page_size=draw(st.sampled_from(page_sizes)),
                                   dtype=draw(st.sampled_from(dtypes)))
        tile = None
    batch = draw(st.integers(1, bounds.max_batch))
    s_q = draw(st.integers(1, prob.max_s_q))
    lens = draw(st.lists(seqlen_strategy(prob.page_size, bounds, tile),
                         min_size=batch, max_size=batch))
    noncontig = False if prob.fused else draw(st.booleans())
    extra = draw(st.integers(0, bounds.max_extra_table))
    seed = draw(st.integers(0, 2**31 - 1))
    fmt = kvformat.get(prob.kv)
    # drawn only for 8-bit caches, so a 16-bit problem's draws are what they were
    edges = draw(st.booleans()) if fmt.quantized else False
    per_seq = draw(st.booleans()) if fmt.needs_descale else False
    return Case(prob, batch, s_q, h, tuple(lens), seed, noncontig, extra, edges, per_seq)


def problems(spec: Union[Schedule, Problem], bounds: Bounds = Bounds(), **kw
             ) -> st.SearchStrategy:
    """MlaInputs drawn for a schedule or a problem (see `cases`)."""
    return cases(spec, bounds, **kw).map(lambda c: c.inputs())


# ---------------------------------------------------------------- schedules --------
# Compile-time knobs (each distinct value is a build) come from short lists; run-time knobs
# are drawn freely.  Values a target never allows are left out; the rest go through rules.
# Each backend's tuning space, split by its knob record's compile_time metadata.  A space may
# name problem knobs too (page size, dtype, max_s_q compiled into a template); those are
# compile-time unless the backend lists them in ``run_time_problem_knobs``.
def _space(compile_time: bool) -> dict[str, dict[str, tuple]]:
    out = {}
    for b in all_backends():
        fields = {f.name: f for f in dataclasses.fields(b.mapping)}
        run_problem = set(getattr(b, "run_time_problem_knobs", ()))

        def is_compile(k: str) -> bool:
            if k in fields:
                return fields[k].metadata.get("compile_time", True)
            return k not in run_problem

        out[b.kind] = {k: v for k, v in b.tuning_space().items()
                       if is_compile(k) == compile_time}
    return out


COMPILE_KNOBS = _space(True)
RUN_KNOBS = _space(False)


def default_base(target: str) -> Schedule:
    """A small starting schedule per target (16 heads a device, as TP8 DeepSeek-V3)."""
    try:
        knobs = backend(target).verify_base()
    except KeyError:
        raise ValueError(f"unknown target {target!r}") from None
    return Schedule.build(name=f"drawn-{target}", target=target, **knobs)


def legal(s: Schedule) -> bool:
    """Whether a schedule passes every rule and fits its target (the file path's checks)."""
    from ..schedule.rules import check

    try:
        check(s)
    except ScheduleError:
        return False
    return True


@st.composite
def schedules(draw, target: str, base: Optional[Schedule] = None,
              neighbourhood: bool = True) -> Schedule:
    """A legal schedule for `target`.  With `neighbourhood`, at most one compile-time knob
    differs from `base` (so a run builds at most 1 + sum of the alternatives' count
    variants); without it, every compile-time knob is drawn.  Run-time knobs are always
    drawn.  Illegal draws are rejected (assume(False)), never failures."""
    base = base or default_base(target)
    if base.target.kind != target:
        raise ValueError(f"base schedule is for {base.target.kind!r}, not {target!r}")
    knobs: dict = {}
    compile_knobs = COMPILE_KNOBS[target]
    if neighbourhood:
        name = draw(st.sampled_from((None,) + tuple(compile_knobs)))
        if name is not None:
            knobs[name] = draw(st.sampled_from(compile_knobs[name]))
    else:
        for name, values in compile_knobs.items():
            knobs[name] = draw(st.sampled_from(values))
    for name, values in RUN_KNOBS[target].items():
        knobs[name] = draw(st.sampled_from(values))
    s = dataclasses.replace(base.replace(**knobs), name=base.name + "-drawn")
    assume(legal(s))
    return s
