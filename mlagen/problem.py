"""MLA decode problems: shapes, and random workloads with paged caches.

Conventions (FlashMLA's, see docs/conventions.md):
    q            [b, s_q, h_q, d]            d = kv_lora_rank + rope_dim (576)
    k_cache      [num_blocks, page, h_kv, d] V is its first dv = kv_lora_rank columns
    block_table  int32 [b, max_blocks]       page indices of each sequence, in order
    cache_seqlens int32 [b]
    out          [b, s_q, h_q, dv] (q's dtype);  lse fp32 [b, h_q, s_q], natural log
    (MlaInputs.dv says dv; mlagen.reference computes the same in fp32 or fp64)
Fused (the seed's operator) adds the up-projection inputs; see FusedWeights.

Cache slots that a kernel must never read (unused pages, the tail of each last page) are
filled with NaN so that any over-read shows in the output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Optional, Sequence

import torch

from . import kvformat
from .errors import InputError
from .schedule.records import Problem

if TYPE_CHECKING:
    from .rope import Rope

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class FusedWeights:
    """Up-projection weights of one card's heads (absorb mode).

    w_uq  [q_lora_rank, h, nope + rope]   q = q_lora @ w_uq  (per head: nope | rope parts)
    w_uk  [h, nope, kv_lora_rank]         q_lat[h] = q_nope[h] @ w_uk[h]
    w_uv  [h, kv_lora_rank, v_head_dim]   out[h]   = o_lat[h] @ w_uv[h]
    rope  how q_pe is rotated (mlagen.rope: a RopeConfig or a RotaryTable); None: plain
          RoPE at rope_theta on DeepSeek's interleaved pairs
    """

    w_uq: torch.Tensor
    w_uk: torch.Tensor
    w_uv: torch.Tensor
    rope_theta: float = 10000.0
    rope: Optional["Rope"] = None


@dataclass
class MlaInputs:
    q: Optional[torch.Tensor]            # [b, s_q, h, d]; None for the fused operator
    k_cache: torch.Tensor                # [num_blocks, page, 1, d]
    block_table: torch.Tensor            # int32 [b, max_blocks]
    cache_seqlens: torch.Tensor          # int32 [b]
    softmax_scale: float
    causal: bool = True
    q_lora: Optional[torch.Tensor] = None        # fused: [b, s_q, q_lora_rank]
    weights: Optional[FusedWeights] = None       # fused
    meta: dict = field(default_factory=dict)     # how it was drawn (for repro files)
    dv: int = 512                                # attention: V is the cache's first dv columns
    kv_format: str = ""                          # mlagen.kvformat name; "": from k_cache
    k_descale: Optional[torch.Tensor] = None     # fp8_e4m3: fp32 [1] or [b]

    @property
    def kv(self) -> str:
        """The cache's format: kv_format, or detected from k_cache's dtype and width."""
        if self.kv_format:
            return self.kv_format
        if self.weights is not None:
            w = self.weights
            return kvformat.detect(self.k_cache, w.w_uk.shape[-1],
                                   w.w_uq.shape[-1] - w.w_uk.shape[1])
        # attention: MLA's 64 rope values (another split names its kv_format)
        return kvformat.detect(self.k_cache, self.q.shape[-1] - 64, 64)

    @property
    def batch(self) -> int:
        return self.block_table.shape[0]

    @property
    def s_q(self) -> int:
        return (self.q if self.q is not None else self.q_lora).shape[1]

    @property
    def heads(self) -> int:
        return self.q.shape[2] if self.q is not None else self.weights.w_uk.shape[0]

    @property
    def page_size(self) -> int:
        return self.k_cache.shape[1]

    def to(self, device) -> "MlaInputs":
        mv = lambda t: None if t is None else t.to(device)   # noqa: E731
        w = self.weights
        if w is not None:
            w = replace(w, w_uq=mv(w.w_uq), w_uk=mv(w.w_uk), w_uv=mv(w.w_uv))
        return replace(self, q=mv(self.q), k_cache=mv(self.k_cache),
                       block_table=mv(self.block_table), cache_seqlens=mv(self.cache_seqlens),
                       q_lora=mv(self.q_lora), weights=w, k_descale=mv(self.k_descale))


@dataclass
class SparsePool:
    """One pool of keys a sparse query row attends to: a paged cache in any kvformat and,
    per query row, the slots it names.

    k_cache   [blocks, page, 1, width]
    indices   int32 [b, s_q, topk]: page * page_size + offset; negative entries (FlashMLA
              writes -1) name no key; an entry may repeat (it is then that many keys)
    topk_length  int32 [b] or None: only each row's first topk_length[i] entries count
    """

    k_cache: torch.Tensor
    indices: torch.Tensor
    topk_length: Optional[torch.Tensor] = None
    kv_format: Optional[str] = None
    k_descale: Optional[torch.Tensor] = None


@dataclass
class MlaOutputs:
    out: torch.Tensor                    # [b, s_q, h, dv] or fused [b, s_q, h, v_head_dim]
    lse: torch.Tensor                    # [b, h, s_q]: fp32 from kernels
    extra: dict = field(default_factory=dict)    # e.g. an emulator's trace and timeline


def positions(cache_seqlens: torch.Tensor, s_q: int) -> torch.Tensor:
    """Absolute position of each query token: the last s_q tokens of the sequence.
    [b, s_q] int64; negative when a sequence is shorter than s_q (such rows see nothing)."""
    return cache_seqlens.long()[:, None] - s_q + torch.arange(s_q, device=cache_seqlens.device)


def make_paged_cache(seqlens: Sequence[int], page_size: int, d: int, dtype: torch.dtype,
                     generator: torch.Generator, shuffle: bool = True, nan_fill: bool = True,
                     extra_blocks: int = 2, max_blocks: Optional[int] = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """A paged cache holding len(seqlens) sequences and its block table.

    Pages are assigned in a random order (shuffle); unused pages, the table's unused entries'
    targets and the tail of each last page hold NaN (nan_fill).
    """
    if page_size < 1:
        raise InputError(f"page_size must be >= 1, got {page_size}")
    if any(s < 0 for s in seqlens):
        raise InputError(f"sequence lengths must be >= 0, got {min(seqlens)}")
    if extra_blocks < 0:
        raise InputError(f"extra_blocks must be >= 0, got {extra_blocks}")
    b = len(seqlens)
    need = [max(1, math.ceil(s / page_size)) for s in seqlens]
    max_blocks = max(max_blocks or 0, max(need) if need else 1)
    num_blocks = sum(need) + extra_blocks
    cache = torch.randn(num_blocks, page_size, 1, d, generator=generator).to(dtype)
    order = torch.randperm(num_blocks, generator=generator) if shuffle \
        else torch.arange(num_blocks)
    table = torch.empty(b, max_blocks, dtype=torch.int32)
    spare = order[sum(need):]          # pages that belong to no sequence
    pos = 0
    for i, s in enumerate(seqlens):
        pages = order[pos:pos + need[i]]
        pos += need[i]
        table[i, :need[i]] = pages.to(torch.int32)
        # unused table entries point at spare (NaN) pages, as a real allocator's stale ones
        fill = spare[torch.randint(len(spare), (max_blocks - need[i],), generator=generator)] \
            if len(spare) else pages[:1].repeat(max_blocks - need[i])
        table[i, need[i]:] = fill.to(torch.int32)
        if nan_fill:
            used = s - (need[i] - 1) * page_size       # tokens used in the last page
            cache[pages[-1], used:] = float("nan")
    if nan_fill and len(spare):
        cache[spare] = float("nan")
    return cache, table


def fused_weights(problem: Problem, heads: int, g: torch.Generator) -> FusedWeights:
    """Random up-projections of `heads` heads of a fused problem (unit-variance outputs)."""
    dtype = TORCH_DTYPES[problem.dtype]
    nope, rope, r = problem.qk_nope_head_dim, problem.rope_dim, problem.q_lora_rank
    return FusedWeights(
        w_uq=(torch.randn(r, heads, nope + rope, generator=g) * r ** -0.5).to(dtype),
        w_uk=(torch.randn(heads, nope, problem.kv_lora_rank, generator=g) * nope ** -0.5
              ).to(dtype),
        w_uv=(torch.randn(heads, problem.kv_lora_rank, problem.v_head_dim, generator=g)
              * problem.kv_lora_rank ** -0.5).to(dtype))


def make_inputs(problem: Problem, batch: int, seqlens: Sequence[int], *, s_q: int = 1,
                heads: Optional[int] = None, seed: int = 0, shuffle: bool = True,
                nan_fill: bool = True, device: str | torch.device = "cpu",
                q_noncontiguous: bool = False, kv_edges: bool = False,
                descale_per_seq: bool = False) -> MlaInputs:
    """A random workload for a problem (heads defaults to problem.heads).

    q_noncontiguous makes q (or, fused, q_lora) a strided view, as a caller slicing a wider
    tensor would pass; kernels must honour its strides or reject it.

    An 8-bit problem.kv_format quantizes the random cache (mlagen.kvformat): unused slots
    stay NaN in every byte's meaning (NaN e4m3 values, scales and rope).  kv_edges puts the
    quantizer's edge cases into a quarter of the tokens (a tile whose amax is exactly 448
    times a power of two, an all-zero tile, a tile whose scale rounds up); fp8_e4m3's
    k_descale is one for the cache, or one per sequence with descale_per_seq.
    """
    seqlens = [int(s) for s in seqlens]
    if len(seqlens) != batch:
        raise InputError(f"{len(seqlens)} sequence lengths given for batch {batch}")
    if batch < 1:
        raise InputError(f"batch must be >= 1, got {batch}")
    if min(seqlens) < 0:
        raise InputError(f"sequence lengths must be >= 0, got {min(seqlens)}")
    if s_q < 1:
        raise InputError(f"s_q must be >= 1, got {s_q}")
    if heads is not None and heads < 1:
        raise InputError(f"heads must be >= 1, got {heads}")
    if problem.dtype not in TORCH_DTYPES:
        raise InputError(f"dtype {problem.dtype!r} is not one of {sorted(TORCH_DTYPES)}")
    g = torch.Generator().manual_seed(seed)
    dtype = TORCH_DTYPES[problem.dtype]
    h = heads or problem.heads
    d = problem.d
    cache, table = make_paged_cache(seqlens, problem.page_size, d, dtype, g, shuffle, nan_fill)
    seq = torch.tensor(list(seqlens), dtype=torch.int32)
    meta = dict(batch=batch, seqlens=list(seqlens), s_q=s_q, heads=h, seed=seed,
                page_size=problem.page_size, dtype=problem.dtype, fused=problem.fused,
                shuffle=shuffle, nan_fill=nan_fill, q_noncontiguous=q_noncontiguous)
    descale = None
    fmt = kvformat.get(problem.kv)
    if fmt.quantized:
        meta.update(kv_format=fmt.name, kv_edges=kv_edges, descale_per_seq=descale_per_seq)
        if kv_edges:
            _quantizer_edges(cache, problem.kv_lora_rank, fmt.tile() or kvformat.DS_TILE, g)
        if fmt.needs_descale:
            descale = _draw_descale(cache, table, seqlens, problem.page_size,
                                    descale_per_seq, g)
        cache = kvformat.quantize(cache, fmt.name, _per_block(descale, table, cache.shape[0]),
                                  problem.kv_lora_rank)
    wide = 2 if q_noncontiguous else 1     # q drawn twice as wide, then strided (below)
    if problem.fused:
        w = fused_weights(problem, h, g)
        q_lora = torch.randn(batch, s_q, wide * problem.q_lora_rank, generator=g).to(dtype)
        inp = MlaInputs(None, cache, table, seq, problem.default_scale(), problem.causal,
                        q_lora=q_lora, weights=w, meta=meta, dv=problem.dv,
                        kv_format=problem.kv, k_descale=descale)
    else:
        q = torch.randn(batch, s_q, wide * h, d, generator=g).to(dtype)
        inp = MlaInputs(q, cache, table, seq, problem.default_scale(), problem.causal,
                        meta=meta, dv=problem.dv, kv_format=problem.kv, k_descale=descale)
    inp = inp.to(device)
    if q_noncontiguous:
        # a strided view (every other head of q, every other column of q_lora), made after
        # the move since Tensor.to makes a non-dense tensor contiguous
        if inp.q is not None:
            inp = replace(inp, q=inp.q[:, :, ::2])
        else:
            inp = replace(inp, q_lora=inp.q_lora[:, :, ::2])
    return inp


def _quantizer_edges(cache: torch.Tensor, rank: int, t: int, g: torch.Generator) -> None:
    """In a quarter of the tokens, of the tiles of t latent values that carry one scale:
    tile 0 all zero, tile 1 with amax exactly 448 / 128 (its scale is exactly 2^-7 and a
    value lands on 448), tile 2 with amax just above it (the scale rounds up a power of
    two).  In place, NaN rows untouched."""
    flat = cache.view(-1, cache.shape[-1])
    rows = torch.nonzero(torch.rand(flat.shape[0], generator=g) < 0.25).flatten()
    rows = rows[~torch.isnan(flat[rows].float()).any(dim=-1)]
    tiles = rank // t
    for k, amax in ((0, 0.0), (1, 3.5), (2, 3.5 * 1.01)):
        if k >= tiles:
            break
        tile = flat[rows, k * t:(k + 1) * t].float()
        peak = tile.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
        tile = tile / peak * amax
        tile[:, 0] = amax          # the amax itself, exactly
        flat[rows, k * t:(k + 1) * t] = tile.to(cache.dtype)


def _draw_descale(cache, table, seqlens, page, per_seq, g) -> torch.Tensor:
    """fp8_e4m3's k_descale: amax / 448 of the finite values (of each sequence, per_seq),
    times a factor in [1, 1.5) so that it is not a power of two."""
    if per_seq:
        amax = []
        for i, s in enumerate(seqlens):
            pages = table[i, :max(1, -(-s // page))].long()
            v = cache[pages].reshape(-1, cache.shape[-1])[:max(s, 1)].float()
            v = v[torch.isfinite(v)]
            amax.append(float(v.abs().max()) if v.numel() else 1.0)
        a = torch.tensor(amax, dtype=torch.float32)
    else:
        v = cache.float()
        v = v[torch.isfinite(v)]
        a = torch.tensor([float(v.abs().max()) if v.numel() else 1.0], dtype=torch.float32)
    a = torch.where(a > 0, a, torch.ones_like(a))
    return a / kvformat.E4M3_MAX * (1 + 0.5 * torch.rand(a.shape, generator=g))


def _per_block(descale, table, num_blocks):
    """k_descale [b] as one value per cache page (for quantizing the whole cache): each
    sequence's pages take its descale; pages of no sequence the first."""
    if descale is None or descale.numel() == 1:
        return descale
    out = torch.full((num_blocks,), float(descale[0]), dtype=torch.float32)
    for i in range(table.shape[0]):
        out[table[i].long()] = descale[i]
    return out


# ---- token-sparse workloads ------------------------------------------------------------

@dataclass
class SparseInputs:
    """A token-sparse decode workload: q (or, for the fused operator, q_lora, the weights
    and each sequence's length, whose last s_q positions the query tokens take), the pools
    it attends to (mlagen.reference's sparse_attention), the per-head sinks."""

    q: Optional[torch.Tensor]                    # [b, s_q, h_q, d]; None for the fused operator
    pools: list                                  # [SparsePool]: the main pool, then extras
    softmax_scale: float
    attn_sink: Optional[torch.Tensor] = None     # fp32 [h_q]
    dv: int = 512
    meta: dict = field(default_factory=dict)
    q_lora: Optional[torch.Tensor] = None        # fused: [b, s_q, q_lora_rank]
    weights: Optional[FusedWeights] = None       # fused
    cache_seqlens: Optional[torch.Tensor] = None  # fused: int32 [b], each >= s_q (RoPE positions)

    @property
    def rows(self) -> tuple[int, int]:
        """(batch, s_q)."""
        return tuple((self.q if self.q is not None else self.q_lora).shape[:2])

    def to(self, device) -> "SparseInputs":
        mv = lambda t: None if t is None else t.to(device)   # noqa: E731
        pools = [replace(p, k_cache=mv(p.k_cache), indices=mv(p.indices),
                         topk_length=mv(p.topk_length), k_descale=mv(p.k_descale))
                 for p in self.pools]
        w = self.weights
        if w is not None:
            w = replace(w, w_uq=w.w_uq.to(device), w_uk=w.w_uk.to(device),
                        w_uv=w.w_uv.to(device))
        return replace(self, q=mv(self.q), pools=pools, attn_sink=mv(self.attn_sink),
                       q_lora=mv(self.q_lora), weights=w,
                       cache_seqlens=mv(self.cache_seqlens))


def slots_of(positions: torch.Tensor, block_table: torch.Tensor, page: int) -> torch.Tensor:
    """Token positions [b, s_q, topk] of each sequence (-1: none) -> the cache slots a sparse
    kernel takes, page * page_size + offset (-1 kept)."""
    b = positions.shape[0]
    pos = positions.long()
    none = pos < 0
    pos = torch.where(none, 0, pos)
    rows = torch.arange(b, device=pos.device)[:, None, None].expand_as(pos)
    slots = block_table.long()[rows, pos // page] * page + pos % page
    return torch.where(none, -1, slots).to(torch.int32)


def sparse_pool(seqlens: Sequence[int], s_q: int, topk: int, page_size: int, d: int,
                dtype: torch.dtype, g: torch.Generator, kv_format: str = "",
                rank: int = 512, invalid: float = 0.0, repeats: float = 0.0,
                topk_length: bool = False, windows: bool = False) -> SparsePool:
    """A random pool: a paged cache of the sequences (NaN where no sequence is) and, for each
    query row, up to topk distinct positions of its sequence in a random order, -1 past the
    sequence's length; `invalid` of the entries then set to -1 and `repeats` of them to
    repeat another entry of the row; topk_length draws a length per sequence in [0, topk].

    windows: a row's list is windows of consecutive positions instead (a sliding window, an
    indexer's clusters; up to two pages long, so some cross a page), its pages laid out in
    order (a window crossing a page names adjacent slots of two pages), and a repeated
    entry repeats the one before it (slot, slot, slot + 1)."""
    cache, table = make_paged_cache(seqlens, page_size, d, dtype, g, shuffle=not windows)
    b = len(seqlens)
    pos = torch.full((b, s_q, topk), -1, dtype=torch.int64)
    for i, n in enumerate(seqlens):
        for j in range(s_q):
            take = min(n, topk)
            if take and windows:
                row: list[int] = []
                while len(row) < take:
                    w = int(torch.randint(1, 2 * page_size + 2, (1,), generator=g))
                    start = int(torch.randint(n, (1,), generator=g))
                    row += range(start, min(n, start + w))
                pos[i, j, :take] = torch.tensor(row[:take])
            elif take:
                pos[i, j, :take] = torch.randperm(n, generator=g)[:take]
            if not windows:
                pos[i, j] = pos[i, j, torch.randperm(topk, generator=g)]
    if invalid:
        pos = torch.where(torch.rand(pos.shape, generator=g) < invalid, -1, pos)
    if repeats and topk > 1:
        src = torch.randint(topk, pos.shape, generator=g)
        if windows:
            src = (torch.arange(topk) - 1).clamp(min=0).expand(pos.shape)
        pos = torch.where(torch.rand(pos.shape, generator=g) < repeats,
                          torch.gather(pos, 2, src), pos)
    fmt = kvformat.get(kv_format or ("bf16" if dtype == torch.bfloat16 else "fp16"))
    descale = None
    if fmt.quantized:
        if fmt.needs_descale:
            descale = _draw_descale(cache, table, seqlens, page_size, False, g)
        cache = kvformat.quantize(cache, fmt.name, descale, rank)
    tl = torch.randint(topk + 1, (b,), generator=g, dtype=torch.int32) if topk_length else None
    return SparsePool(cache, slots_of(pos, table, page_size), tl, fmt.name, descale)


def make_sparse_inputs(problem: Problem, batch: int, seqlens: Sequence[int], *, s_q: int = 1,
                       heads: Optional[int] = None, seed: int = 0,
                       extra_seqlens: Optional[Sequence[int]] = None, invalid: float = 0.0,
                       repeats: float = 0.0, topk_length: bool = False,
                       infinite_sinks: bool = False, windows: bool = False,
                       device: str | torch.device = "cpu") -> SparseInputs:
    """A random token-sparse workload for a problem with attention = "sparse": the main pool
    (page_size, kv_format, topk over the sequences' positions) and, with extra_topk, a second
    pool (extra_page_size, extra_kv_format, over extra_seqlens, default the same lengths);
    sinks drawn per head when problem.sinks (infinite_sinks: the first +inf, the last -inf).
    invalid / repeats / topk_length / windows as sparse_pool."""
    seqlens = [int(x) for x in seqlens]
    if problem.attention != "sparse" or problem.topk < 1:
        raise InputError("make_sparse_inputs needs a problem with attention = \"sparse\" and "
                         "topk >= 1")
    if len(seqlens) != batch or batch < 1:
        raise InputError(f"{len(seqlens)} sequence lengths given for batch {batch}")
    if min(seqlens) < 0 or s_q < 1:
        raise InputError("sequence lengths must be >= 0 and s_q >= 1")
    g = torch.Generator().manual_seed(seed)
    dtype = TORCH_DTYPES[problem.dtype]
    h = heads or problem.heads
    rank = problem.kv_lora_rank
    pools = [sparse_pool(seqlens, s_q, problem.topk, problem.page_size, problem.d, dtype, g,
                         problem.kv, rank, invalid, repeats, topk_length, windows)]
    if problem.extra_topk:
        extra = [int(x) for x in (extra_seqlens if extra_seqlens is not None else seqlens)]
        pools.append(sparse_pool(extra, s_q, problem.extra_topk,
                                 problem.extra_page_size or problem.page_size, problem.d, dtype,
                                 g, problem.extra_kv, rank, invalid, repeats, topk_length,
                                 windows))
    if problem.fused:
        # the query tokens take each sequence's last s_q positions (at least 0)
        w = fused_weights(problem, h, g)
        q, q_lora = None, torch.randn(batch, s_q, problem.q_lora_rank, generator=g).to(dtype)
        positions = torch.tensor([max(n, s_q) for n in seqlens], dtype=torch.int32)
    else:
        q = torch.randn(batch, s_q, h, problem.d, generator=g).to(dtype)
        w = q_lora = positions = None
    sink = None
    if problem.sinks:
        sink = torch.randn(h, generator=g) * 2
        if infinite_sinks:
            sink[0], sink[-1] = math.inf, -math.inf
    meta = dict(batch=batch, seqlens=seqlens, s_q=s_q, heads=h, seed=seed,
                extra_seqlens=None if extra_seqlens is None else list(extra_seqlens),
                invalid=invalid, repeats=repeats, topk_length=topk_length,
                infinite_sinks=infinite_sinks, windows=windows)
    mv = lambda t: None if t is None else t.to(device)   # noqa: E731
    pools = [replace(p, k_cache=mv(p.k_cache), indices=mv(p.indices),
                     topk_length=mv(p.topk_length), k_descale=mv(p.k_descale)) for p in pools]
    return SparseInputs(mv(q), pools, problem.default_scale(), mv(sink), problem.dv, meta,
                        q_lora=mv(q_lora), weights=w,
                        cache_seqlens=mv(positions)).to(device)
