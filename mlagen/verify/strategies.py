"""Hypothesis strategies: MLA decode problems and schedules.

problems(spec)        -> MlaInputs   batch, s_q, heads, sequence lengths chosen to sit on the
                                     edges kernels get wrong (0, 1, page +- 1, whole pages,
                                     across KV tiles), shuffled block tables whose unused
                                     entries point at NaN pages, NaN page tails, strided q;
                                     with nonfinite, NaN / +-inf in q and in cache slots
                                     every query row sees; with draw_causal, causal drawn
schedules(target)     -> Schedule    knobs the target allows, illegal draws rejected with
                                     assume(False) through the same rules a file goes through

Tensors come from mlagen.problem.make_inputs with a drawn seed, so hypothesis shrinks the
shape of a case (fewer, shorter sequences) and its data (seed towards 0) alike.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
from hypothesis import assume
from hypothesis import strategies as st

from .. import kvformat
from ..backends import all_backends, backend
from ..errors import ScheduleError
from ..problem import MlaInputs, make_inputs
from ..schedule.records import DTYPES, Problem, Schedule
from . import adversarial
from .profiles import Bounds  # noqa: F401  (defined beside the profiles; re-exported here)
from .sparse import sparse_cases, sparse_path_cases


# ---------------------------------------------------------------- problems ---------
NONFINITE = (math.nan, math.inf, -math.inf)


@dataclass(frozen=True)
class Poison:
    """One non-finite input element (docs/conventions.md, "NaN and Inf").  where "q": query
    token ``row`` of sequence ``seq`` (head ``head``; the fused operator's q_lora has no
    head), element ``col``; where "cache": the sequence's key slot ``row``, one that every
    query row sees, element ``col``."""

    where: str
    seq: int
    row: int
    head: int
    col: int
    value: float

    def describe(self) -> str:
        at = (f"q[{self.seq}, {self.row}, {self.head}, {self.col}]" if self.where == "q"
              else f"cache slot {self.row} of sequence {self.seq}, column {self.col}")
        return f"{self.value} at {at}"


def poison(inp: MlaInputs, poisons: Sequence[Poison]) -> MlaInputs:
    """Write each Poison into inp's q (q_lora) or k_cache, in place (a strided q stays
    strided), and return inp.  Case.inputs() hands it tensors of its own."""
    page = inp.page_size
    for p in poisons:
        if p.where == "q" and inp.q is not None:
            inp.q[p.seq, p.row, p.head, p.col] = p.value
        elif p.where == "q":
            inp.q_lora[p.seq, p.row, p.col] = p.value
        else:
            blk = int(inp.block_table[p.seq, p.row // page])
            _poison_key(inp, blk, p.row % page, p.col, p.value)
    return inp


def _poison_key(inp: MlaInputs, blk: int, slot: int, col: int, value: float) -> None:
    """Value `col` of a cached token made `value`, in the cache's format.  e4m3 has no
    infinity (torch would saturate it to +-448), so a poisoned e4m3 value is NaN; fp8_ds_mla's
    RoPE values are bf16 and take it as it is; its scales are not poisoned (a NaN byte in
    one is a finite, absurd scale, not a nonfinite input)."""
    name = inp.kv
    if name not in ("fp8_e4m3", "fp8_ds_mla"):
        inp.k_cache[blk, slot, 0, col] = value
        return
    raw = inp.k_cache.view(torch.uint8)[blk, slot, 0]
    rank = inp.weights.w_uk.shape[-1] if inp.weights is not None else inp.dv
    if name == "fp8_e4m3" or col < rank:
        raw[col] = 0x7F                                   # e4m3 NaN
    else:
        at = rank + 4 * (rank // kvformat.DS_TILE) + 2 * (col - rank)
        raw[at:at + 2] = torch.tensor([value], dtype=torch.bfloat16).view(torch.uint8)


def seen_by_every_row(length: int, s_q: int, causal: bool) -> int:
    """How many of a sequence's first key slots every query row sees (bottom-right causal:
    the first row sees length - s_q + 1)."""
    return max(0, length - s_q + 1) if causal else length


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
    data: str = "randn"              # adversarial.PATTERNS: how the scores are shaped
    data_arg: int = 0                # the pattern's free choices (where, how steep)
    # planted bad block-table entries: (sequence, which of its pages: "first" | "middle" |
    # "last" or a page index -- the last page of a split piece, say --, negative entry or
    # one past the cache); drawn where the backend's contract says such a sequence comes
    # out NaN (Backend.bad_pages_give_nan)
    bad_pages: tuple[tuple[int, str, bool], ...] = ()
    causal: Optional[bool] = None      # None: the problem's
    poisons: tuple = ()                # Poison elements (NaN / inf inputs)
    kv_edges: bool = False             # 8-bit caches: the quantizer's edge cases in the tokens
    descale_per_seq: bool = False      # fp8_e4m3: one k_descale per sequence, not one
    # a run-time split of the sequences into pieces (Backend.runtime_shapes "split_kv":
    # "auto" or a fixed count), applied to the one build; None: the schedule's own
    split_kv: Optional[Union[int, str]] = None

    def clean_inputs(self) -> MlaInputs:
        """The problem without its bad table entries: what the reference sees."""
        inp = make_inputs(self.problem, self.batch, list(self.seqlens), s_q=self.s_q,
                          heads=self.heads, seed=self.seed, shuffle=True, nan_fill=True,
                          q_noncontiguous=self.q_noncontiguous, kv_edges=self.kv_edges,
                          descale_per_seq=self.descale_per_seq)
        if self.extra_table:
            inp = widen_table(inp, self.extra_table, self.seed)
        inp = adversarial.apply(inp, self.data, self.data_arg)
        if self.causal is not None:
            inp = dataclasses.replace(inp, causal=self.causal)
        inp = poison(inp, self.poisons)
        inp.meta.update(q_noncontiguous=self.q_noncontiguous, extra_table=self.extra_table,
                        fused=self.problem.fused, data=self.data, data_arg=self.data_arg)
        return inp

    def inputs(self) -> MlaInputs:
        inp = self.clean_inputs()
        if self.bad_pages:
            inp = plant_bad_pages(inp, self.bad_pages)
        return inp

    def bad_sequences(self) -> list[int]:
        return sorted({b for b, _, _ in self.bad_pages})

    def describe(self) -> str:
        return (f"batch {self.batch}, s_q {self.s_q}, heads {self.heads}, "
                f"page {self.problem.page_size}, {self.problem.dtype}, seqlens "
                f"{list(self.seqlens)}, seed {self.seed}"
                + (", strided q" if self.q_noncontiguous else "")
                + (f", +{self.extra_table} table columns" if self.extra_table else "")
                + (f", data {self.data} ({self.data_arg})" if self.data != "randn" else "")
                + (f", bad pages {list(self.bad_pages)}" if self.bad_pages else "")
                + ("" if self.causal is None else f", causal {self.causal}")
                + "".join(f", {p.describe()}" for p in self.poisons)
                + (f", KV {self.problem.kv}" if self.problem.kv != self.problem.dtype else "")
                + (", quantizer edges" if self.kv_edges else "")
                + (", descale per sequence" if self.descale_per_seq else "")
                + ("" if self.split_kv is None else f", split_kv {self.split_kv}"))


def plant_bad_pages(inp: MlaInputs, bad: Sequence[tuple[int, str, bool]]) -> MlaInputs:
    """Block-table entries outside the cache, at the first, middle or last page a sequence
    uses (the last is where a check of `pages < last` instead of `<= last` misses)."""
    table = inp.block_table.clone()
    page = inp.page_size
    nb = inp.k_cache.shape[0]
    for b, where, past_end in bad:
        need = -(-int(inp.cache_seqlens[b]) // page)
        j = where if isinstance(where, int) else \
            {"first": 0, "middle": need // 2, "last": need - 1}[where]
        table[b, j] = nb + b if past_end else -1 - b
    return dataclasses.replace(inp, block_table=table,
                               meta=dict(inp.meta, bad_pages=[list(x) for x in bad],
                                         bad_sequences=sorted({b for b, _, _ in bad}),
                                         clean_table=inp.block_table))


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


def seqlen_strategy(page: int, bounds: Bounds, tile: Optional[int] = None, s_q: int = 1,
                    block: Optional[int] = None) -> st.SearchStrategy:
    """One sequence length, weighted towards the edges of pages, tiles and blocks, and
    (s_q > 1) below s_q, where a query row sees no key: drawn with s_q, so s_q > length >
    block comes out of one draw, not two knobs that must meet by chance."""
    edges = sorted({0, 1, page - 1, page, page + 1, 2 * page - 1, 2 * page, 2 * page + 1}
                   - {-1})
    edges = [e for e in edges if 0 <= e <= bounds.long_len]
    # plain integers first: hypothesis shrinks towards the first branch, where a failing
    # length can shrink to its exact threshold; the other branches aim at the edges
    choices = [st.integers(0, bounds.max_len),
               st.sampled_from(edges),
               st.integers(1, max(1, bounds.max_len // page)).map(lambda k: k * page)]
    if s_q > 1:
        choices.append(st.integers(0, s_q - 1))
    long_lo = min(bounds.max_len + 1, bounds.long_len)
    if bounds.long_len > bounds.max_len:
        choices.append(st.integers(long_lo, bounds.long_len))
    for edge in (tile, block):
        if edge and edge <= bounds.long_len:
            # around every multiple of the KV tile (where buffers change hands) and of the
            # kernel's key block (where a block is partial) that fits
            marks = sorted({k * edge + off for k in range(1, bounds.long_len // edge + 1)
                            for off in (-1, 0, 1) if 0 <= k * edge + off <= bounds.long_len})
            choices.append(st.sampled_from(marks))
    return st.one_of(*choices)


def _problem_of(spec: Union[Schedule, Problem]) -> Problem:
    return spec.problem if isinstance(spec, Schedule) else spec


@st.composite
def bad_pages_strategy(draw, seqlens: Sequence[int], s_q: int) -> tuple:
    """Bad block-table entries on sequences that see their keys (length >= s_q): at the
    first, middle or last page, negative or past the cache.  Mostly none (shrinks to none)."""
    eligible = [i for i, n in enumerate(seqlens) if n >= max(1, s_q)]
    if not eligible or draw(st.integers(0, 3)) != 3:
        return ()
    picks = draw(st.lists(st.tuples(st.sampled_from(eligible),
                                    st.sampled_from(("last", "first", "middle")),
                                    st.booleans()),
                          min_size=1, max_size=2, unique_by=lambda x: x[0]))
    return tuple(sorted(picks))


@st.composite
def cases(draw, spec: Union[Schedule, Problem], bounds: Bounds = Bounds(),
          heads: Optional[int] = None, page_sizes: Sequence[int] = (1, 16, 64),
          dtypes: Sequence[str] = DTYPES, head_counts: Sequence[int] = (1, 2, 3, 8, 16),
          patterns: Sequence[str] = adversarial.PATTERNS, nonfinite: bool = False,
          draw_causal: bool = False, bad_pages: bool = True) -> Case:
    """A Case for a schedule (what its build compiles in fixed; what its kernel takes at
    run time -- Backend.runtime_shapes: heads against tile rows, page size against the
    key block -- drawn) or for a bare Problem (heads, page size and dtype drawn).  The
    data is randn or one of the adversarial patterns (`patterns`, the first is what a
    failure shrinks towards).  nonfinite: up to two NaN / +-inf elements in q and in cache
    slots every query row sees (none is the first choice, where shrinking goes);
    draw_causal: causal drawn too (with s_q > length, rows at negative positions then see
    keys); bad_pages: plant bad table entries where the backend's kernels promise NaN."""
    prob = _problem_of(spec)
    if prob.attention == "sparse":       # index lists, not sequences: mlagen.verify.sparse
        return draw(sparse_cases(spec, bounds, heads=heads, patterns=patterns))
    block, bad_nan, shapes = None, False, {}
    if isinstance(spec, Schedule):
        be = backend(spec.target.kind)
        h = heads or spec.heads_per_device
        tile = be.boundary_tile(spec)
        block = getattr(spec.mapping, "block_kv", None)
        shapes = be.runtime_shapes(spec)
        if heads is None and shapes.get("heads"):
            h = draw(st.sampled_from(shapes["heads"]))
        if shapes.get("page_size"):
            prob = dataclasses.replace(prob, page_size=draw(st.sampled_from(
                shapes["page_size"])))
        bad_nan = be.bad_pages_give_nan and bad_pages    # the kernel's contract, not a stand-in's
    else:
        h = heads or draw(st.sampled_from([c for c in head_counts if c <= prob.heads]
                                          or [prob.heads]))
        prob = dataclasses.replace(prob, page_size=draw(st.sampled_from(page_sizes)),
                                   dtype=draw(st.sampled_from(dtypes)))
        tile = None
    batch = draw(st.integers(1, bounds.max_batch))
    s_q = draw(st.integers(1, prob.max_s_q))
    lens = draw(st.lists(seqlen_strategy(prob.page_size, bounds, tile, s_q, block),
                         min_size=batch, max_size=batch))
    noncontig = False if prob.fused else draw(st.booleans())
    extra = draw(st.integers(0, bounds.max_extra_table))
    seed = draw(st.integers(0, 2**31 - 1))
    # drawn last, so that a draw without them is the draw it always was
    causal = draw(st.booleans().map(lambda b: not b)) if draw_causal else None
    poisons = draw(poisons_strategy(prob, batch, s_q, h, lens,
                                    prob.causal if causal is None else causal)) \
        if nonfinite else ()
    if shapes.get("split_kv") and tuple(patterns) == adversarial.PATTERNS:
        patterns = patterns + adversarial.PIECE_PATTERNS     # with the split drawn below
    data = draw(st.sampled_from(tuple(patterns))) if patterns else "randn"
    data_arg = draw(st.integers(0, 63)) if data != "randn" else 0
    bad = draw(bad_pages_strategy(lens, s_q)) if bad_nan else ()
    fmt = kvformat.get(prob.kv)
    # drawn only for 8-bit caches, so a 16-bit problem's draws are what they were
    edges = draw(st.booleans()) if fmt.quantized else False
    per_seq = draw(st.booleans()) if fmt.needs_descale else False
    # the run-time split, drawn with the data that needs it: a warpgroup's half of a piece
    # (dominant_odd) and a max that moves inside a piece need pieces of several blocks,
    # which the scheduler's "auto" split of a short batch over many SMs rarely makes
    split = None
    if isinstance(spec, Schedule) and shapes.get("split_kv"):
        split = 1 if data == "dominant_odd" else draw(st.sampled_from(shapes["split_kv"]))
    return Case(prob, batch, s_q, h, tuple(lens), seed, noncontig, extra, data, data_arg, bad,
                causal=causal, poisons=poisons, kv_edges=edges, descale_per_seq=per_seq,
                split_kv=split)


def poisons_strategy(prob: Problem, batch: int, s_q: int, heads: int, lens: Sequence[int],
                     causal: bool) -> st.SearchStrategy:
    """0, 1 or 2 Poisons (0 first: a failing case shrinks to finite inputs when it can)."""
    width = prob.q_lora_rank if prob.fused else prob.d
    seen = [seen_by_every_row(n, s_q, causal) for n in lens]

    @st.composite
    def one(draw):
        seq = draw(st.integers(0, batch - 1))
        where = draw(st.sampled_from(("q", "cache") if seen[seq] else ("q",)))
        row = draw(st.integers(0, (s_q if where == "q" else seen[seq]) - 1))
        head = draw(st.integers(0, heads - 1))
        value = draw(st.sampled_from(NONFINITE))
        # +-inf in a cache slot only outside V (the RoPE columns): a head whose score it
        # makes -inf gives it weight 0 and 0 * inf in P V, which a split piece of only such
        # keys drops (docs/conventions.md, "NaN and Inf")
        lo = prob.dv if where == "cache" and math.isinf(value) else 0
        col = draw(st.integers(lo, (width if where == "q" else prob.d) - 1))
        return Poison(where, seq, row, head, col, value)
    return st.one_of(st.just(()), st.lists(one(), min_size=1, max_size=2).map(tuple))


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


# ---------------------------------------------------------------- a schedule's family ----
def family(schedule: Schedule) -> list[Schedule]:
    """`schedule` and the legal builds of its family (Backend.verify_family): together
    they reach every compile-time branch of its kernels.  Illegal members are left out."""
    out = [schedule]
    seen = {schedule.variant_name()}
    for knobs in backend(schedule.target.kind).verify_family(schedule):
        try:
            s = dataclasses.replace(schedule.replace(**knobs), name=schedule.name + "-family")
        except (ScheduleError, ValueError, TypeError):
            continue
        if legal(s) and s.variant_name() not in seen:
            seen.add(s.variant_name())
            out.append(s)
    return out


def piece_last_bad_pages(s: Schedule, lens: Sequence[int], split) -> tuple:
    """Bad table entries at the last page of each sequence's first piece, of a split into
    several pieces (Backend.verify_pieces); none for a sequence in one piece."""
    pieces = backend(s.target.kind).verify_pieces(s, list(lens), split) or []
    page = s.problem.page_size
    bad = []
    for b in range(len(lens)):
        mine = sorted((a, e) for r, a, e in pieces if r == b and e > a)
        if len(mine) >= 2:
            bad.append((b, (mine[0][1] - 1) // page, b % 2 == 0))
    return tuple(bad)


def path_cases(s: Schedule, bounds: Bounds = Bounds()) -> list[Case]:
    """A few fixed cases that take a schedule's run-time branches at once: rows that see no
    key beside split sequences (s_q > length > block), lengths one past a block, a page and
    a tile, scores that rise past any rescale slack, a dominant late key, huge logits, every
    run-time head count and page size, and bad pages at a piece's first, middle and last
    page (where the backend's contract makes that sequence NaN).  Many sequences a case: a
    launch checks many problems."""
    if s.problem.attention == "sparse":
        return sparse_path_cases(s, bounds)
    be = backend(s.target.kind)
    prob = s.problem
    h = s.heads_per_device
    sq = prob.max_s_q
    block = getattr(s.mapping, "block_kv", None) or 64
    tile = be.boundary_tile(s) or 0
    fused = prob.fused
    cap = bounds.long_len
    shapes = be.runtime_shapes(s)

    def lens_for(page: int) -> tuple[int, ...]:
        # one short of, exactly on and one past each edge (a piece that ends exactly on a
        # tile or page edge is where `>` for `>=` hides)
        want = {0, 1, max(0, sq - 1), block - 1, block + 1, 2 * block, page, page + 1,
                2 * page, 2 * page + 1, min(cap, 4 * max(block, page) + 3)}
        if tile:
            want |= {tile - 1, tile, tile + 1}
        return tuple(sorted(x for x in want if 0 <= x <= cap))

    fmt = kvformat.get(prob.kv)

    def case(p: Problem, lens, s_q, heads, data, arg, seed, bad=(), split=None):
        # 8-bit caches: the quantizer's edges (tiles of distinct scales) in every other case,
        # a descale per sequence in the others
        return Case(p, len(lens), s_q, heads, tuple(lens), seed, not fused and seed % 2 == 1,
                    seed % 3, data, arg, bad, kv_edges=fmt.quantized and seed % 2 == 0,
                    descale_per_seq=fmt.needs_descale and seed % 2 == 1, split_kv=split)

    long = min(cap, max(8 * block, 3 * prob.page_size + 5))
    out = [case(prob, lens_for(prob.page_size), sq, h, "rising", 2, 1),
           case(prob, (long, long // 2 + 1, 3 * block), sq, h, "dominant", 5, 2),
           case(prob, (long, block + 1, 0), max(1, sq // 2), h, "very_large", 0, 3),
           case(prob, (long, 2 * block), 1, h, "rising", 7, 4)]
    if not fused:
        # query rows 12 binades apart (a kernel that rescales q rows per row)
        out.append(case(prob, (block + 1, 2 * block, 1), sq, h, "q_spread", 1, 17))
    if fmt.quantized and not fused:
        # e4m3 NaN bytes in a token every row sees, in a 4-byte word's upper half (bytes 2
        # and 7: a converter places the halves of a word apart) and in the RoPE
        nan = float("nan")
        poisons = (Poison("cache", 0, 0, 0, 2, nan), Poison("cache", 1, block + 3, 0, 7, nan),
                   Poison("cache", 1, 5, 0, prob.kv_lora_rank + 2, nan))
        out.append(dataclasses.replace(
            case(prob, (block + 1, 2 * block + 5), sq, h, "randn", 0, 18), poisons=poisons))
    for heads in shapes.get("heads", ())[1:]:
        out.append(case(prob, (block + 1, long), sq, heads, "rising", heads, 5 + heads))
    for page in shapes.get("page_size", ())[1:]:
        # s_q at most 2: a block's keys inside a larger page do not depend on the query rows
        p = dataclasses.replace(prob, page_size=page)
        out.append(case(p, lens_for(page), min(sq, 2), h, "dominant", page, 6 + page))
    splits = shapes.get("split_kv", ())
    if 1 in splits:
        # whole-sequence pieces (the scheduler's "auto" cuts a short batch into one-block
        # pieces over many SMs): the max moves inside a piece past the slack (rising, from
        # the start and from halfway), the larger max in the second warpgroup's blocks
        # (dominant_odd), and two warpgroups' random maxima merged (randn)
        lens = (long, 3 * block + 7, 2 * block + 1)
        out.append(case(prob, lens, sq, h, "rising", 1, 10, split=1))
        out.append(case(prob, lens, sq, h, "rising", 9, 11, split=1))
        out.append(case(prob, lens, sq, h, "dominant_odd", 3, 12, split=1))
        out.append(case(prob, lens, 1, h, "randn", 0, 13, split=1))
    if "auto" in splits:
        # many requests, two long: the "auto" split's cost plan (neither equal pieces nor
        # whole requests a part) for the part counts of 64-row tiles of 128 heads, whose
        # parts start inside a request (scheduler.plan's general branch)
        lens = (min(cap, 1100),) * 2 + (block + 1,) * 31
        out.append(case(prob, lens, sq, h, "rising", 2, 15))
    fixed = [n for n in splits if n not in (1, "auto")]
    if fixed:
        # rows that see no key (causal, s_q past the length; an empty sequence) cut into
        # forced pieces: every partial lse is -inf and the combine alone makes the row's
        # +inf; the "auto" split leaves such short requests whole
        out.append(case(prob, (1, max(1, sq - 1), 0, block + 1), sq, h, "rising", 3, 16,
                        split=max(fixed)))
    if be.bad_pages_give_nan and fixed:
        # a bad entry at the last page of each sequence's first piece (neither its first,
        # middle nor last page), the pieces as the backend's scheduler cuts them
        u = max(block, prob.page_size, 64)
        lens = tuple(min(cap, x) for x in (9 * u + 5, 7 * u + 3, 6 * u + 1))
        out.append(case(prob, lens, sq, h, "randn", 0, 14,
                        piece_last_bad_pages(s, lens, max(fixed)), split=max(fixed)))
    if be.bad_pages_give_nan:
        lens = (long, long, long, 1 + block)
        bad = ((0, "last", True), (1, "first", False), (2, "middle", True))
        out.append(case(prob, lens, 1, h, "randn", 0, 8, bad))
        out.append(case(prob, (long, long), sq, h, "rising", 2, 9, ((1, "last", False),)))
    return out
