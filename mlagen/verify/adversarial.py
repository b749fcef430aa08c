"""Adversarial data: scores shaped so the online softmax's rare paths run.

Random data (randn) almost never moves a row's running maximum after its first block, so a
kernel that forgets to rescale its running sum when the max moves -- or rescales only past
a slack, or merges two partial states the wrong way round -- passes every random test.  A
pattern here rewrites the tensors of a drawn problem (after make_inputs, before the kernel
and the reference see them, so both get the same rounded values):

    randn          unchanged
    rising         scores climb along each sequence, from a drawn start onward, by a drawn
                   step (log2 units per 64 keys, up to well past any kernel's rescale slack):
                   the max moves at late blocks
    dominant       one key, at a drawn position of each sequence, scores far above the rest
    dominant_odd   the same, its key in an odd 64-key block of the sequence (1, 3, 5, ...):
                   where a kernel whose two warpgroups take alternate blocks of a piece puts
                   it in the second's half (a whole-sequence piece: split_kv = 1)
    ties           every key of a sequence is the same key: all its scores tie
    very_negative  every score shifted far below zero (exp of the raw score underflows)
    very_large     every score shifted far above zero (exp of the raw score overflows)
    q_spread       (a path case, never drawn) each query row scaled by its own power of two,
                   2^0 down to 2^-12: a kernel that scales q rows into a narrower type
                   (mla_fp8_regs.cuh's fp16) and undoes it with another row's scale, or none

Attention-only problems get exact control: every query holds 1 in the first rope column
(column dv = 512) and key t holds f(t) / softmax_scale there, so key t's score is its
random score plus f(t) nats; V (the first dv columns) keeps its random values and the
output checks stay tight.  The fused operator's query is computed inside the kernel, so
there the rope columns of key t are scaled by a factor instead (its scores grow in size,
both signs; the max still tends to move late).  Slots past a sequence keep their NaN.

The patterns are on values, not bit patterns: a quantized KV format (mlagen.kvformat) is
dequantized, shaped and quantized again, so a new format plugs in through kvformat alone.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import kvformat
from ..problem import MlaInputs

PATTERNS = ("randn", "rising", "dominant", "ties", "very_negative", "very_large")
# drawn only where the schedule's pieces are drawn too (Backend.runtime_shapes "split_kv")
PIECE_PATTERNS = ("dominant_odd",)
ODD_BLOCK = 64                 # dominant_odd: the block size whose odd blocks hold the key
# path cases alone (strategies.path_cases): adding them leaves hypothesis's draws as they were
ROW_PATTERNS = ("q_spread",)
Q_SPREAD_BINADES = 13          # q_spread: rows at 2^0 .. 2^-12 (down: scores shrink, stay exact)
# rising: log2 units per 64-key block (past a rescale slack of 8, and well past it)
RISE_STEPS = (3.0, 9.0, 12.0, 24.0)
# far past any slack, and past 128 log2 units (2^128 overflows fp32): a merge of two
# partial states that keeps the smaller max overflows where the dominant key is the other's
DOMINANT_NATS = 100.0
SHIFT_NATS = 600.0             # 2^(600 log2 e) overflows fp32: the max must be subtracted


def _key_positions(inp: MlaInputs, b: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(page index, slot) in k_cache of keys 0..n-1 of sequence b."""
    page = inp.k_cache.shape[1]
    t = torch.arange(n, device=inp.k_cache.device)
    return inp.block_table[b, t // page].long(), t % page


def apply(inp: MlaInputs, pattern: str, arg: int) -> MlaInputs:
    """`inp` with its scores shaped by `pattern`; `arg` (any non-negative int) picks the
    pattern's free choices (where a rise starts, its step, the dominant key's place)."""
    if pattern == "randn":
        return inp
    if pattern not in PATTERNS + PIECE_PATTERNS + ROW_PATTERNS:
        raise ValueError(f"unknown data pattern {pattern!r}; one of "
                         f"{PATTERNS + PIECE_PATTERNS + ROW_PATTERNS}")
    if pattern == "q_spread":
        return _q_spread(inp, arg)
    fmt = kvformat.get(inp.kv)
    page_descale = _page_descale(inp) if fmt.quantized else None
    # a quantized cache is shaped as values and stored again in its format (kernel and
    # reference then read the same bytes; e4m3 saturates a steep ramp at its range)
    k = (kvformat.dequantize(inp.k_cache, fmt.name, page_descale, inp.dv,
                             torch.float32) if fmt.quantized else inp.k_cache.clone())
    dv = inp.dv
    lens = inp.cache_seqlens.tolist()
    fused = inp.q is None
    scale = inp.softmax_scale
    for b, n in enumerate(lens):
        if n == 0:
            continue
        pages, slots = _key_positions(inp, b, n)
        t = torch.arange(n, dtype=torch.float64)
        if pattern == "ties":
            k[pages, slots] = k[pages[0], slots[0]].clone()
            continue
        if pattern == "rising":
            step = RISE_STEPS[arg % len(RISE_STEPS)]
            start = (arg // len(RISE_STEPS)) % 4 * n // 4      # 0, 1/4, 1/2, 3/4 of the way
            f = (t - start).clamp(min=0) * (step * math.log(2) / 64)
        elif pattern == "dominant":
            f = torch.zeros(n, dtype=torch.float64)
            f[(arg * 2654435761 + b * 40503) % n] = DOMINANT_NATS
        elif pattern == "dominant_odd":
            f = torch.zeros(n, dtype=torch.float64)
            f[odd_block_key(n, arg, b)] = DOMINANT_NATS
        elif pattern == "very_negative":
            f = torch.full((n,), -SHIFT_NATS, dtype=torch.float64)
        else:                                                    # very_large
            f = torch.full((n,), SHIFT_NATS, dtype=torch.float64)
        if fused:
            # the query is the kernel's own: grow the rope columns' share instead
            g = 1.0 + f.abs() / 4.0
            k[pages, slots, :, dv:] = (k[pages, slots, :, dv:].double()
                                       * g[:, None, None]).to(k.dtype)
        else:
            top = torch.finfo(k.dtype).max / 4          # fp16: a tiny scale must not overflow
            k[pages, slots, :, dv] = (f / scale).clamp(-top, top).to(k.dtype)[:, None]
    descale = inp.k_descale
    if fmt.needs_descale and descale is not None:
        # a descale that covers the shaped values (else e4m3 saturates a ramp at 448 x the
        # old one and the max stops moving): raised to amax / 448 where they outgrew it
        descale = _covering_descale(inp, k, descale)
        page_descale = _page_descale(dataclasses.replace(inp, k_descale=descale))
    if fmt.quantized:
        k = kvformat.quantize(k, fmt.name, page_descale, dv)
    out = dataclasses.replace(inp, k_cache=k, k_descale=descale)
    if not fused:
        # q may be a strided view of a wider tensor: write through it, keeping its strides
        q = inp.q.clone() if inp.q.is_contiguous() else _strided_copy(inp.q)
        q[..., dv] = 1.0
        if pattern == "ties":
            q[..., dv] = inp.q[..., dv]
        out = dataclasses.replace(out, q=q)
    out.meta = dict(inp.meta, data=pattern, data_arg=arg)
    return out


def _q_spread(inp: MlaInputs, arg: int) -> MlaInputs:
    """q_spread: query row (b, s, h) times 2^-e, e = (131 b + 17 s + 7 h + arg) % 13 (exact
    in bf16 and fp16 for randn rows); the cache unchanged.  The fused operator's query is the
    kernel's own: unchanged there."""
    if inp.q is None:
        return inp
    b, s_q, h = inp.q.shape[:3]
    e = (131 * torch.arange(b)[:, None, None] + 17 * torch.arange(s_q)[None, :, None]
         + 7 * torch.arange(h)[None, None, :] + arg) % Q_SPREAD_BINADES
    f = torch.pow(2.0, -e.double()).to(inp.q.device)
    q = inp.q.clone() if inp.q.is_contiguous() else _strided_copy(inp.q)
    q.copy_((q.double() * f[..., None]).to(q.dtype))
    out = dataclasses.replace(inp, q=q)
    out.meta = dict(inp.meta, data="q_spread", data_arg=arg)
    return out


def odd_block_key(n: int, arg: int, b: int) -> int:
    """dominant_odd's key of a sequence of n keys: in odd block 2 j + 1 (j drawn from arg
    and the sequence), at a drawn offset; the last key when the sequence has no odd block
    (n <= 64: a one-block piece, no second warpgroup's half)."""
    odd = -(-n // ODD_BLOCK) // 2            # blocks 1, 3, ... below ceil(n / 64)
    if not odd:
        return n - 1
    blk = 2 * ((arg // ODD_BLOCK + b) % odd) + 1
    return min(n - 1, blk * ODD_BLOCK + (arg * 37 + b * 11) % ODD_BLOCK)


def _covering_descale(inp: MlaInputs, k: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """d (fp32 [1] or [b]) raised where the values k of the sequences' keys (of all of
    them, for one descale) exceed 448 * d."""
    amax = []
    for b, n in enumerate(inp.cache_seqlens.tolist()):
        if n:
            pages, slots = _key_positions(inp, b, n)
            v = k[pages, slots].float()
            v = v[torch.isfinite(v)]
            amax.append(float(v.abs().max()) if v.numel() else 0.0)
        else:
            amax.append(0.0)
    need = torch.tensor(amax if d.numel() > 1 else [max(amax, default=0.0)],
                        dtype=torch.float32) / kvformat.E4M3_MAX
    return torch.maximum(d.float(), need.to(d.device)).to(d.dtype)


def _page_descale(inp: MlaInputs):
    """fp8_e4m3's descale as the cache's pages take it (one a sequence -> one a page)."""
    d = inp.k_descale
    if d is None or d.numel() == 1:
        return d
    out = torch.full((inp.k_cache.shape[0],), float(d[0]), dtype=torch.float32)
    for b in range(inp.block_table.shape[0]):
        out[inp.block_table[b].long().clamp(0, inp.k_cache.shape[0] - 1)] = d[b].float()
    return out


def _strided_copy(q: torch.Tensor) -> torch.Tensor:
    """A copy of a strided view of q with the same strides (a view of a fresh base)."""
    base = torch.empty_strided(q.size(), q.stride(), dtype=q.dtype, device=q.device)
    # empty_strided with the view's strides makes a base big enough for them
    base.copy_(q)
    return base


# ---- token-sparse workloads -------------------------------------------------------------

# exp(+-100) already leaves fp32's range, so the max must still be subtracted; 600 nats in
# one key column costs an fp32 dot product about 1e-4 nats (the big term's ulp), which a
# few dozen keys whose V values cancel turn into more than fp16's output tolerance -- a
# limit of fp32 scores, the reference's own fp32 run shows it too
SPARSE_SHIFT_NATS = 100.0

# the largest score shift (nats) the sparse patterns turn into a rope-column factor on the
# fused operator: 1 + 96 / 4 = 25x, what `apply` reaches over 1100 keys at its steepest rise
FUSED_NATS = 96.0


def _named(pool, b: int, s: int) -> torch.Tensor:
    """The slots row (b, s) of a SparsePool attends to, in list order (after topk_length)."""
    idx = pool.indices[b, s].long()
    if pool.topk_length is not None:
        idx = idx[:int(pool.topk_length[b])]
    return idx[idx >= 0]


def apply_sparse(inp, pattern: str, arg: int, rank: int):
    """A SparseInputs (mlagen.problem) with its scores shaped by `pattern`, as `apply` does
    for paged sequences: a row's keys are its valid entries in list order (the main pool's,
    then the extra pool's); q holds 1 in the first rope column (``rank``) and each named
    slot f(t) / softmax_scale there.  A slot several rows name takes the last row's value
    (the pattern then holds for that row; the others still see steep, uneven scores)."""
    if pattern == "randn":
        return inp
    if pattern not in PATTERNS:
        raise ValueError(f"unknown data pattern {pattern!r}; one of {PATTERNS}")
    b_n, s_n = inp.rows
    scale = inp.softmax_scale
    fused = inp.q is None          # the query is the kernel's own (phase A): keys alone
    caches = []
    for pool in inp.pools:
        fmt = kvformat.get(pool.kv_format or "bf16")
        k = (kvformat.dequantize(pool.k_cache, fmt.name, pool.k_descale, rank, torch.float32)
             if fmt.quantized else pool.k_cache.clone())
        caches.append((fmt, k))
    for b in range(b_n):
        for s in range(s_n):
            named = [(i, _named(p, b, s)) for i, p in enumerate(inp.pools)]
            n = sum(len(x) for _, x in named)
            if n == 0:
                continue
            t = torch.arange(n, dtype=torch.float64)
            if pattern == "ties":
                first = next(x[0] for _, x in named if len(x))
                i0 = next(i for i, x in named if len(x))
                src = caches[i0][1].view(-1, *caches[i0][1].shape[2:])[first].clone()
                for i, x in named:
                    flat = caches[i][1].view(-1, *caches[i][1].shape[2:])
                    flat[x] = src.to(flat.dtype)
                continue
            if pattern == "rising":
                step = RISE_STEPS[arg % len(RISE_STEPS)]
                start = (arg // len(RISE_STEPS)) % 4 * n // 4
                f = (t - start).clamp(min=0) * (step * math.log(2) / 64)
            elif pattern == "dominant":
                f = torch.zeros(n, dtype=torch.float64)
                f[(arg * 2654435761 + (b * s_n + s) * 40503) % n] = DOMINANT_NATS
            elif pattern == "very_negative":
                f = torch.full((n,), -SPARSE_SHIFT_NATS, dtype=torch.float64)
            else:
                f = torch.full((n,), SPARSE_SHIFT_NATS, dtype=torch.float64)
            at = 0
            for i, x in named:
                flat = caches[i][1].view(-1, *caches[i][1].shape[2:])
                top = torch.finfo(flat.dtype).max / 4
                if fused:
                    # as `apply` on the fused operator: the rope columns' share grows, by
                    # at most what `apply` reaches at its longest sequences (a row's 2048
                    # entries would reach 45x: then one rounding step of the absorbed q
                    # moves a score by nats, a difference only the elementwise allowance
                    # covers, not the cosine bound)
                    g = 1.0 + f[at:at + len(x)].abs().clamp(max=FUSED_NATS) / 4.0
                    flat[x, :, rank:] = (flat[x, :, rank:].double()
                                         * g[:, None, None]).to(flat.dtype)
                else:
                    flat[x, :, rank] = (f[at:at + len(x)] / scale).clamp(-top, top) \
                        .to(flat.dtype)[:, None]
                at += len(x)
    pools = [dataclasses.replace(p, k_cache=kvformat.quantize(k, fmt.name, p.k_descale, rank)
                                 if fmt.quantized else k)
             for p, (fmt, k) in zip(inp.pools, caches)]
    q = None if fused else inp.q.clone()
    if pattern != "ties" and not fused:
        q[..., rank] = 1.0
    return dataclasses.replace(inp, q=q, pools=pools,
                               meta=dict(inp.meta, data=pattern, data_arg=arg))
