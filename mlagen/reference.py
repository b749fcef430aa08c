"""Torch references for MLA decode: latent attention, the fused absorbed operator, plain MLA.

Every kernel mlagen generates is compared against these (docs/conventions.md has the rules
they implement).  They are written for clarity and for speed on small problems, since the
verifier calls them thousands of times: every step is a batched tensor operation, and the
only Python loop is over chunks of the batch (to bound memory on long sequences).

Rounding points: a kernel keeps some intermediates in the storage dtype (bf16/fp16) that
this reference would otherwise hold in float64.  ``run(..., rounded=...)`` rounds at the
named points, so a kernel is compared with the result it is meant to compute:

    "q"      the fused operator's absorbed query (its phase A writes it in the storage dtype)
    "o_lat"  the fused operator's latent output (phase B writes it in the storage dtype)
    "p"      the softmax weights before the P @ V product: exp(s - rowmax) rounded, divided
             by the unrounded sum (the tensor cores take P in the inputs' dtype; FlashMLA's
             tests round the same way)
    "q_e4m3" an 8-bit cache's query in e4m3 MMAs (a schedule's fp8_mma = "mma"): each
             (token, head) row quantized on the fly, q_scale = amax |q| / 448 in float32
             (a zero row 1, a row with inf or NaN NaN), q = e4m3(q / q_scale) * q_scale
    "p_e4m3" the softmax weights in e4m3 MMAs: 2^(x - ceil(max x)) (x the score in log2
             units, the kernel's integer running max) rounded to e4m3, divided by
             the sum of the rounded weights (the kernel's row sum adds them), so lse is the
             log of that sum

Each backend declares its kernels' points (``Backend.rounded``); the verifier's oracle
(mlagen.verify.oracle) is this reference at those points plus the allowances that remain.

Reading the cache: a sequence's slot t lives at ``k_cache[block_table[i, t // page], t % page]``
and only slots t < cache_seqlens[i] are ever looked at.  Pages outside that range are not
indexed at all (their table entries may be anything), and the tail of the last page is
replaced by zeros with ``torch.where`` before any arithmetic, so NaN there cannot leak even
as 0 * NaN.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import kvformat
from .errors import InputError
from .problem import FusedWeights, MlaInputs, MlaOutputs, SparseInputs, SparsePool, positions
from .rope import Rope, RopeConfig, RotaryTable, rotate

__all__ = ["attention", "sparse_attention", "quantize_q_e4m3", "SparsePool", "fused_absorbed", "fused_plain",
           "absorb_query", "rope", "rope_cos_sin", "weights_rope", "run", "ROUNDING_POINTS"]

ROUNDING_POINTS = ("q", "o_lat", "p", "q_e4m3", "p_e4m3")

# Elements of one gathered KV chunk (b_chunk * slots * h_kv * d) before the batch is split:
# 2**25 float64 values = 256 MiB.
_CHUNK_ELEMENTS = 1 << 25


# ---- input checks ----------------------------------------------------------------------

def _check_cache(k_cache: torch.Tensor, block_table: torch.Tensor,
                 cache_seqlens: torch.Tensor) -> None:
    if k_cache.dim() != 4:
        raise InputError(f"k_cache must be [num_blocks, page, h_kv, d], got {tuple(k_cache.shape)}")
    if block_table.dim() != 2 or block_table.dtype != torch.int32:
        raise InputError(f"block_table must be int32 [b, max_blocks], got "
                         f"{block_table.dtype} {tuple(block_table.shape)}")
    if cache_seqlens.dim() != 1 or cache_seqlens.dtype != torch.int32:
        raise InputError(f"cache_seqlens must be int32 [b], got "
                         f"{cache_seqlens.dtype} {tuple(cache_seqlens.shape)}")
    b = block_table.shape[0]
    if cache_seqlens.shape[0] != b:
        raise InputError(f"cache_seqlens has {cache_seqlens.shape[0]} entries, "
                         f"block_table {b} rows")
    if b == 0:
        return
    page = k_cache.shape[1]
    lens = cache_seqlens.long()
    if int(lens.min()) < 0:
        raise InputError(f"cache_seqlens must be >= 0, got min {int(lens.min())}")
    cap = block_table.shape[1] * page
    if int(lens.max()) > cap:
        raise InputError(f"a sequence of {int(lens.max())} tokens does not fit the block table "
                         f"({block_table.shape[1]} pages of {page})")
    # only the entries that hold a sequence's tokens are read, so only those must be in range
    used = torch.arange(block_table.shape[1], device=lens.device)[None, :] \
        < ((lens + page - 1) // page)[:, None]
    entries = block_table.long()[used.to(block_table.device)]
    if entries.numel() and (int(entries.min()) < 0 or int(entries.max()) >= k_cache.shape[0]):
        raise InputError(f"block_table entries in use must lie in [0, {k_cache.shape[0]}), got "
                         f"[{int(entries.min())}, {int(entries.max())}]")


def _check_dtype(dtype: torch.dtype) -> None:
    if dtype not in (torch.float32, torch.float64):
        raise InputError(f"the reference computes in float32 or float64, not {dtype}")


# ---- shared pieces ---------------------------------------------------------------------

class _Decode:
    """Stored tokens -> values (mlagen.kvformat): the cache's format and k_descale, whose
    per-sequence entries follow the batch chunk."""

    def __init__(self, name: str, descale: Optional[torch.Tensor], rank: int):
        self.name, self.descale, self.rank = name, descale, rank

    def __call__(self, kv: torch.Tensor, lo: int, hi: int, dtype: torch.dtype) -> torch.Tensor:
        v = kvformat.dequantize(kv, self.name, None, self.rank, dtype)
        d = self.descale
        if d is not None:
            ones = [1] * (kv.dim() - 1)
            d = d.to(kv.device, dtype)
            v = v * (d.reshape(1, *ones) if d.numel() == 1 else d[lo:hi].reshape(-1, *ones))
        return v


def _decoder(k_cache: torch.Tensor, kv_format: Optional[str], k_descale, rank: int, d: int,
             batch: int) -> Optional[_Decode]:
    """The cache's decoder; None for a cache of plain values (a cast)."""
    if kv_format is None and k_cache.dtype not in (kvformat.FP8, torch.uint8):
        if k_descale is not None:
            raise InputError("k_descale is for fp8_e4m3 caches; this cache is "
                             f"{k_cache.dtype}")
        return None
    name = kv_format or kvformat.detect(k_cache, rank, d - rank)
    fmt = kvformat.get(name)
    if not fmt.quantized:
        kvformat.check_descale(k_descale, name, batch)
        return None
    if k_cache.dim() == 4 and k_cache.shape[-1] != fmt.width(rank, d - rank):
        raise InputError(f"a {name} k_cache for head dim {d} is [..., {fmt.width(rank, d - rank)}]"
                         f", got [..., {k_cache.shape[-1]}]")
    return _Decode(name, kvformat.check_descale(k_descale, name, batch), rank)


def _gather(k_cache: torch.Tensor, block_table: torch.Tensor, lens: torch.Tensor,
            slots: int, dtype: torch.dtype, decode: Optional[_Decode] = None, lo: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``slots`` tokens of each sequence: kv [b, slots, h_kv, d] in dtype, zero at
    slots >= its length, and valid [b, slots].  Pages past a sequence's length are not
    indexed (their table entries are replaced by page 0 and masked).  decode: the cache's
    format (default: a plain cast); lo: the chunk's first sequence, for its descale."""
    page = k_cache.shape[1]
    b = block_table.shape[0]
    pages = -(-slots // page)
    t = torch.arange(pages * page, device=k_cache.device)
    valid = t[None, :] < lens[:, None]                                   # [b, slots']
    page_used = torch.arange(pages, device=k_cache.device)[None, :] \
        < ((lens + page - 1) // page)[:, None]                           # [b, pages]
    table = torch.where(page_used, block_table[:, :pages].long(), 0)
    kv = k_cache[table]                                   # [b, pages, page, h_kv, width]
    kv = decode(kv, lo, lo + b, dtype) if decode is not None else kv.to(dtype)
    kv = kv.reshape(b, pages * page, *kv.shape[3:])                      # [b, slots', h_kv, d]
    kv = torch.where(valid[:, :, None, None], kv, 0)
    return kv[:, :slots], valid[:, :slots]


def _visible(lens: torch.Tensor, valid: torch.Tensor, s_q: int, causal: bool) -> torch.Tensor:
    """[b, s_q, slots]: may query row i see key t?  Bottom-right causal alignment:
    row i sees keys t < len - s_q + i + 1."""
    if not causal:
        return valid[:, None, :].expand(-1, s_q, -1)
    t = torch.arange(valid.shape[1], device=valid.device)
    limit = lens[:, None] - s_q + 1 + torch.arange(s_q, device=valid.device)[None, :]
    return (t[None, None, :] < limit[:, :, None]) & valid[:, None, :]


def quantize_q_e4m3(q: torch.Tensor) -> torch.Tensor:
    """The "q_e4m3" rounding point: q [..., d] with each row quantized as the e4m3-MMA kernel
    does it (float32 with subnormals flushed: q_scale = max(amax |q| / 448, 2^-126), 1 for
    a zero row, NaN for a row holding an inf or a NaN; e4m3 = round-to-nearest-even of
    q / q_scale), returned dequantized in float64 (e4m3 * q_scale, exact)."""
    x = q.float()
    # the kernel's build flushes float32 subnormals: such a q value is 0, a scale >= 2^-126
    x = torch.where(x.abs() < 2.0 ** -126, 0.0, x)
    finite = torch.isfinite(x)
    amax = torch.where(finite, x.abs(), 0.0).amax(dim=-1, keepdim=True)
    # amax / 448 correctly rounded on every device: CUDA torch divides by a Python scalar as
    # a product with its reciprocal (one float32 step off at times, and with it every
    # e4m3 value of the row); the float64 quotient of a float32 by 7 * 2^6 never sits
    # within 2^-53 of a float32 rounding point, so rounding it again is exact
    qs = torch.where(amax > 0, (amax.double() / 448.0).float().clamp_min(2.0 ** -126),
                     torch.ones_like(amax))
    qs = torch.where(finite.all(dim=-1, keepdim=True), qs, math.nan)
    q8 = (x / qs).to(torch.float8_e4m3fn)
    return q8.double() * qs.double()


def _softmax(scores: torch.Tensor, visible: torch.Tensor,
             round_p: Optional[torch.dtype] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """scores [b, h, s_q, slots] (already scaled), visible [b, s_q, slots] ->
    (p, lse [b, h, s_q]).  A row with no visible key gets p = 0 and lse = +inf.  With
    round_p, exp(s - rowmax) is rounded to that dtype before it is divided by its
    (unrounded) sum: the "p" rounding point; torch.float8_e4m3fn, the "p_e4m3" point: the
    sum and lse are the rounded weights' too.

    Non-finite scores (docs/conventions.md, "NaN and Inf"): a -inf score weighs nothing,
    so a row whose every visible score is -inf is an empty row; a NaN or +inf score makes
    the row's p and lse NaN (exp(inf - inf), as an online softmax computes it)."""
    vis = visible[:, None]
    scores = scores.masked_fill(~vis, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)                                # -inf when empty
    poisoned = torch.isnan(lse) | (lse == math.inf)
    empty = lse == -math.inf                     # no visible key, or only -inf scores
    lse = torch.where(poisoned, math.nan, lse)
    if round_p is None:
        p = torch.exp(scores - torch.where(empty, 0.0, lse)[..., None])
    else:
        top = scores.amax(dim=-1, keepdim=True)
        if round_p == torch.float8_e4m3fn:
            # the kernel's integer max in log2 units: 2^(x - ceil(max x)) rounds to e4m3 as
            # at any integer max (powers of two commute with the rounding, normal range)
            top = torch.ceil(top / math.log(2)) * math.log(2)
        e = torch.exp(scores - torch.where(empty[..., None], 0.0, top))  # 0 where not visible
        total = e.sum(dim=-1, keepdim=True)
        if round_p == torch.float8_e4m3fn:
            # float32 first: the kernel rounds its float32 exp2
            e = e.float().to(round_p).to(e.dtype)
            total = e.sum(dim=-1, keepdim=True)
            lse = torch.where(empty | poisoned, lse,
                              top.squeeze(-1) + torch.log(total.squeeze(-1)))
        p = e.to(round_p).to(e.dtype) / torch.where(total > 0, total, 1.0)
    p = torch.where(poisoned[..., None], math.nan, p)
    return p, torch.where(empty, math.inf, lse)


def _chunks(lens: torch.Tensor, per_slot: int):
    """Split the batch so that one gathered chunk stays under _CHUNK_ELEMENTS.
    Yields (start, stop, slots) with slots the longest length in the chunk."""
    b = lens.shape[0]
    longest = int(lens.max()) if b else 0
    step = max(1, _CHUNK_ELEMENTS // max(1, longest * per_slot))
    for start in range(0, b, step):
        stop = min(b, start + step)
        yield start, stop, int(lens[start:stop].max())


# ---- latent attention (FlashMLA's convention) -----------------------------------------

def attention(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
              cache_seqlens: torch.Tensor, dv: int = 512, softmax_scale: Optional[float] = None,
              causal: bool = True, dtype: torch.dtype = torch.float32,
              round_p: Optional[torch.dtype] = None, kv_format: Optional[str] = None,
              k_descale: Optional[torch.Tensor] = None, rope_dim: int = 64
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged attention with V = the first dv columns of K (round_p: the "p" rounding point,
    see the module's docstring).  The cache may be in any mlagen.kvformat (kv_format, or
    detected from its dtype and width; fp8_e4m3 takes k_descale; the format's quantized
    part is the first d - rope_dim values); it is dequantized exactly.

    q [b, s_q, h_q, d], k_cache [num_blocks, page, h_kv, d] (h_q a multiple of h_kv; query
    head j uses KV head j // (h_q // h_kv)), block_table int32 [b, max_blocks],
    cache_seqlens int32 [b].  Returns out [b, s_q, h_q, dv] and lse [b, h_q, s_q] (natural
    log of the sum of exp(scale * q.k)), both in dtype.  softmax_scale defaults to d**-0.5.
    """
    _check_dtype(dtype)
    _check_cache(k_cache, block_table, cache_seqlens)
    if q.dim() != 4:
        raise InputError(f"q must be [b, s_q, h_q, d], got {tuple(q.shape)}")
    b, s_q, h_q, d = q.shape
    h_kv = k_cache.shape[2]
    if b != block_table.shape[0]:
        raise InputError(f"q has batch {b}, block_table {block_table.shape[0]} rows")
    if not 0 < dv <= d:
        raise InputError(f"dv = {dv} must lie in (0, {d}]")
    decode = _decoder(k_cache, kv_format, k_descale, d - rope_dim, d, b)
    if decode is None and d != k_cache.shape[3]:
        raise InputError(f"q has head dim {d}, k_cache {k_cache.shape[3]}")
    if h_kv < 1 or h_q % h_kv:
        raise InputError(f"h_q = {h_q} must be a multiple of h_kv = {h_kv}")
    if s_q < 1:
        raise InputError("s_q must be >= 1")
    scale = d ** -0.5 if softmax_scale is None else float(softmax_scale)
    g = h_q // h_kv
    dev = q.device
    lens = cache_seqlens.to(dev).long()
    out = torch.zeros(b, s_q, h_q, dv, dtype=dtype, device=dev)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=dtype, device=dev)
    qd = q.to(dtype).reshape(b, s_q, h_kv, g, d)
    k_cache, block_table = k_cache.to(dev), block_table.to(dev)
    for lo, hi, slots in _chunks(lens, h_kv * d):
        if slots == 0:
            continue                      # every row empty: out 0, lse +inf already
        kv, valid = _gather(k_cache, block_table[lo:hi], lens[lo:hi], slots, dtype, decode, lo)
        vis = _visible(lens[lo:hi], valid, s_q, causal)
        scores = torch.einsum("bskgd,btkd->bkgst", qd[lo:hi], kv) * scale
        scores = scores.reshape(hi - lo, h_q, s_q, slots)
        p, lse[lo:hi] = _softmax(scores, vis, round_p)
        o = torch.einsum("bkgst,btkv->bskgv", p.reshape(hi - lo, h_kv, g, s_q, slots),
                         kv[..., :dv])
        out[lo:hi] = o.reshape(hi - lo, s_q, h_q, dv)
    return out, lse


# ---- token-sparse attention (FlashMLA's sparse decode convention) ----------------------

def _check_pool(pool: SparsePool, b: int, s_q: int, d: int, rope_dim: int) -> None:
    c, idx = pool.k_cache, pool.indices
    if c.dim() != 4 or c.shape[2] != 1:
        raise InputError(f"k_cache must be [blocks, page, 1, width], got {tuple(c.shape)}")
    if idx.dtype != torch.int32 or idx.dim() != 3 or tuple(idx.shape[:2]) != (b, s_q):
        raise InputError(f"indices must be int32 [b = {b}, s_q = {s_q}, topk], got "
                         f"{idx.dtype} {tuple(idx.shape)}")
    cap = c.shape[0] * c.shape[1]
    if idx.numel() and int(idx.max()) >= cap:
        raise InputError(f"indices name slot {int(idx.max())}; the cache holds {cap} "
                         f"({c.shape[0]} pages of {c.shape[1]})")
    tl = pool.topk_length
    if tl is not None:
        if tl.dtype != torch.int32 or tuple(tl.shape) != (b,):
            raise InputError(f"topk_length must be int32 [{b}], got {tl.dtype} {tuple(tl.shape)}")
        if tl.numel() and int(tl.min()) < 0:
            raise InputError(f"topk_length must be >= 0, got {int(tl.min())}")


def _pool_keys(pool: SparsePool, lo: int, hi: int, d: int, rope_dim: int,
               dtype: torch.dtype, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys [c, s_q, topk, d] of batch rows lo:hi (zero where no key) and valid [c, s_q, topk].
    Only the pages a valid entry names are decoded (a page-major format decodes whole
    pages)."""
    c = pool.k_cache.to(dev)
    page = c.shape[1]
    idx = pool.indices[lo:hi].to(dev).long()
    valid = idx >= 0
    if pool.topk_length is not None:
        pos = torch.arange(idx.shape[-1], device=dev)
        valid &= pos[None, None, :] < pool.topk_length[lo:hi].to(dev).long()[:, None, None]
    slot = torch.where(valid, idx, 0)
    pages, inv = torch.unique(slot // page, return_inverse=True)
    decode = _decoder(c, pool.kv_format, pool.k_descale, d - rope_dim, d, 1)
    if pool.k_descale is not None and pool.k_descale.numel() > 1:
        raise InputError("a sparse pool's k_descale is one for its cache (fp32 [1])")
    got = c[pages]                                                 # [n, page, 1, width]
    vals = decode(got[None], 0, 1, dtype)[0] if decode is not None else got.to(dtype)
    keys = vals[inv, slot % page, 0]                                # [c, s_q, topk, d]
    return torch.where(valid[..., None], keys, 0), valid


def sparse_attention(q: torch.Tensor, pools: list[SparsePool], dv: int = 512,
                     softmax_scale: Optional[float] = None,
                     attn_sink: Optional[torch.Tensor] = None,
                     dtype: torch.dtype = torch.float32, round_p: Optional[torch.dtype] = None,
                     rope_dim: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-sparse attention: query row (i, s) attends to the keys its pools' indices name,
    all pools in one softmax (FlashMLA's indices / extra_k_cache, 9241ae3), V = the first dv
    values of each key.  attn_sink [h_q] fp32: the output (not the lse) is scaled by
    exp(lse) / (exp(lse) + exp(sink)) (a sink of +inf makes it 0).  A row with no key gets
    out 0 and lse +inf.  q [b, s_q, h_q, d]; returns out [b, s_q, h_q, dv] and lse
    [b, h_q, s_q] in dtype.  softmax_scale defaults to d**-0.5."""
    _check_dtype(dtype)
    if q.dim() != 4:
        raise InputError(f"q must be [b, s_q, h_q, d], got {tuple(q.shape)}")
    if not pools:
        raise InputError("sparse attention needs at least one pool of keys")
    b, s_q, h_q, d = q.shape
    if not 0 < dv <= d:
        raise InputError(f"dv = {dv} must lie in (0, {d}]")
    for pool in pools:
        _check_pool(pool, b, s_q, d, rope_dim)
    if attn_sink is not None and (attn_sink.dtype != torch.float32
                                  or tuple(attn_sink.shape) != (h_q,)):
        raise InputError(f"attn_sink must be fp32 [h_q = {h_q}], got {attn_sink.dtype} "
                         f"{tuple(attn_sink.shape)}")
    dev = q.device
    out = torch.zeros(b, s_q, h_q, dv, dtype=dtype, device=dev)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=dtype, device=dev)
    for lo, hi, p, row_lse, v in sparse_weights(q, pools, dv, softmax_scale, dtype, round_p,
                                                rope_dim):
        lse[lo:hi] = row_lse
        out[lo:hi] = torch.einsum("chst,cstv->cshv", p, v)
    if attn_sink is not None:
        out = out * sink_keep(lse, attn_sink)[..., None]
    return out, lse


def sparse_weights(q: torch.Tensor, pools: list[SparsePool], dv: int = 512,
                   softmax_scale: Optional[float] = None, dtype: torch.dtype = torch.float32,
                   round_p: Optional[torch.dtype] = None, rope_dim: int = 64):
    """sparse_attention's softmax, batch rows lo:hi at a time (inputs it has checked):
    yields (lo, hi, p [c, h_q, s_q, T], lse [c, h_q, s_q], v [c, s_q, T, dv]) with T the
    pools' entries side by side (zero keys and weights where an entry names none); out is
    p @ v, before the sink."""
    b, s_q, h_q, d = q.shape
    scale = d ** -0.5 if softmax_scale is None else float(softmax_scale)
    dev = q.device
    per_row = s_q * sum(p.indices.shape[-1] for p in pools) * d
    step = max(1, _CHUNK_ELEMENTS // max(1, per_row))
    for lo in range(0, b, step):
        hi = min(b, lo + step)
        parts = [_pool_keys(p, lo, hi, d, rope_dim, dtype, dev) for p in pools]
        keys = torch.cat([k for k, _ in parts], dim=2)              # [c, s_q, T, d]
        valid = torch.cat([v for _, v in parts], dim=2)             # [c, s_q, T]
        scores = torch.einsum("cshd,cstd->chst", q[lo:hi].to(dtype), keys) * scale
        p, row_lse = _softmax(scores, valid, round_p)
        yield lo, hi, p, row_lse, keys[..., :dv]


def sink_keep(lse: torch.Tensor, attn_sink: torch.Tensor) -> torch.Tensor:
    """[b, s_q, h_q]: the factor exp(lse) / (exp(lse) + exp(sink)) an attention sink
    scales a row's output by (0 for a row with no key, lse +inf)."""
    sink = attn_sink.to(lse.device, lse.dtype)
    l = lse.transpose(1, 2)                                         # [b, s_q, h_q]
    return torch.where(torch.isinf(l) & (l > 0), 0.0, torch.sigmoid(l - sink[None, None]))


# ---- RoPE ------------------------------------------------------------------------------

def rope_cos_sin(pos: torch.Tensor, rope_dim: int, theta: float = 10000.0,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [*pos.shape, rope_dim // 2] of the angles pos * theta**(-2i / rope_dim).
    The angles are formed in float64 (positions reach 1e5; a float32 angle would be off by
    ~1e-2 rad there) and rounded to dtype at the end."""
    c, s = RopeConfig(theta=theta).cos_sin(pos, rope_dim)
    return c.to(dtype), s.to(dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float | Rope = 10000.0) -> torch.Tensor:
    """Rotate x [..., d] at integer positions pos (broadcastable to x.shape[:-1]).  theta is
    a plain RoPE base (DeepSeek's interleaved pairs) or any rope (mlagen.rope: a config with
    its scaling and layout, or a rotary table)."""
    r = theta if isinstance(theta, (RopeConfig, RotaryTable)) else RopeConfig(theta=theta)
    return rotate(x, pos, r)


def weights_rope(weights: FusedWeights) -> Rope:
    """The rope a fused operator applies: weights.rope, or plain RoPE at weights.rope_theta."""
    return weights.rope if weights.rope is not None else RopeConfig(theta=weights.rope_theta)


# ---- the fused operator (the seed's), absorbed and plain ---------------------------

def _split_query(q_lora: torch.Tensor, weights: FusedWeights, cache_seqlens: torch.Tensor,
                 rope_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """q_lora @ w_uq split per head into q_nope [b, s_q, h, nope] and the rotated q_pe
    [b, s_q, h, rope_dim] (RoPE at each token's absolute position)."""
    _check_dtype(dtype)
    if q_lora.dim() != 3:
        raise InputError(f"q_lora must be [b, s_q, q_lora_rank], got {tuple(q_lora.shape)}")
    w_uq = weights.w_uq
    if w_uq.dim() != 3 or w_uq.shape[0] != q_lora.shape[2]:
        raise InputError(f"w_uq must be [q_lora_rank = {q_lora.shape[2]}, h, nope + rope], "
                         f"got {tuple(w_uq.shape)}")
    if not 0 < rope_dim < w_uq.shape[2] or rope_dim % 2:
        raise InputError(f"rope_dim = {rope_dim} must be even, > 0 and < w_uq's last dim "
                         f"{w_uq.shape[2]}")
    if cache_seqlens.shape != (q_lora.shape[0],):
        raise InputError(f"cache_seqlens must be [{q_lora.shape[0]}], got "
                         f"{tuple(cache_seqlens.shape)}")
    dev = q_lora.device
    q = torch.einsum("bsr,rhe->bshe", q_lora.to(dtype), w_uq.to(dev, dtype))
    nope = w_uq.shape[2] - rope_dim
    pos = positions(cache_seqlens.to(dev), q_lora.shape[1])             # [b, s_q]
    return q[..., :nope], rope(q[..., nope:], pos[:, :, None], weights_rope(weights))


def _check_weights(weights: FusedWeights, nope: int, rank: int, h: int) -> None:
    if weights.w_uk.shape != (h, nope, rank):
        raise InputError(f"w_uk must be [h, nope, kv_lora_rank] = {(h, nope, rank)}, got "
                         f"{tuple(weights.w_uk.shape)}")
    if weights.w_uv.dim() != 3 or weights.w_uv.shape[:2] != (h, rank):
        raise InputError(f"w_uv must be [h = {h}, kv_lora_rank = {rank}, v_head_dim], got "
                         f"{tuple(weights.w_uv.shape)}")


def absorb_query(q_lora: torch.Tensor, weights: FusedWeights, cache_seqlens: torch.Tensor,
                 s_q: int, rope_dim: int = 64, dtype: torch.dtype = torch.float32
                 ) -> torch.Tensor:
    """The absorbed query q [b, s_q, h, kv_lora_rank + rope_dim]: (q_nope @ w_uk[h] | rope(q_pe)).
    Attention of this q on the latent cache gives the latent output o_lat."""
    if q_lora.dim() != 3 or q_lora.shape[1] != s_q:
        raise InputError(f"q_lora must be [b, s_q = {s_q}, q_lora_rank], got "
                         f"{tuple(q_lora.shape)}")
    q_nope, q_pe = _split_query(q_lora, weights, cache_seqlens, rope_dim, dtype)
    h, nope = q_nope.shape[2], q_nope.shape[3]
    _check_weights(weights, nope, weights.w_uk.shape[-1], h)
    q_lat = torch.einsum("bshn,hnc->bshc", q_nope, weights.w_uk.to(q_nope.device, dtype))
    return torch.cat((q_lat, q_pe), dim=-1)


def _check_negative_rows(rope: Rope, cache_seqlens: torch.Tensor, s_q: int) -> None:
    """Without causal, a row at position -k (a sequence shorter than s_q) sees keys and is
    turned by the negative angle: a rotary table must hold row k (mlagen.rope.cos_sin)."""
    if not isinstance(rope, RotaryTable):
        return
    lens = cache_seqlens.tolist()
    deepest = max((s_q - n for n in lens if 0 < n < s_q), default=0)
    if deepest >= rope.rows:
        raise InputError(f"a row at position -{deepest} (a sequence shorter than s_q, not "
                         f"causal) needs the rotary table's row {deepest}; it has "
                         f"{rope.rows} rows")


def fused_absorbed(q_lora: torch.Tensor, weights: FusedWeights, k_cache: torch.Tensor,
                   block_table: torch.Tensor, cache_seqlens: torch.Tensor,
                   softmax_scale: float, causal: bool = True, rope_dim: int = 64,
                   dtype: torch.dtype = torch.float32, rounded: tuple[str, ...] = (),
                   kv_format: Optional[str] = None, k_descale: Optional[torch.Tensor] = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused MLA decode operator in absorb mode: out [b, s_q, h, v_head_dim] and lse
    [b, h, s_q].  The cache holds (c_kv | k_pe) per token, k_pe already rotated, in any
    mlagen.kvformat (as attention).  rounded: the rounding points to apply (see the
    module's docstring)."""
    out, lse, _ = _fused_absorbed(q_lora, weights, k_cache, block_table, cache_seqlens,
                                  softmax_scale, causal, rope_dim, dtype, rounded,
                                  kv_format, k_descale)
    return out, lse


def _fused_absorbed(q_lora, weights, k_cache, block_table, cache_seqlens, softmax_scale,
                    causal, rope_dim, dtype, rounded, kv_format=None, k_descale=None) -> tuple:
    """fused_absorbed, also returning {"q": absorbed query, "o_lat": latent output}, each
    as computed before its own rounding point."""
    if q_lora.dim() != 3:
        raise InputError(f"q_lora must be [b, s_q, q_lora_rank], got {tuple(q_lora.shape)}")
    _check_rounded(rounded)
    store = q_lora.dtype
    if not causal:
        _check_negative_rows(weights_rope(weights), cache_seqlens, q_lora.shape[1])
    q = absorb_query(q_lora, weights, cache_seqlens, q_lora.shape[1], rope_dim, dtype)
    rank = weights.w_uk.shape[-1]
    width = _cache_width(k_cache, kv_format, rank, rope_dim)
    if k_cache.dim() != 4 or k_cache.shape[-1] != width:
        raise InputError(f"k_cache must be [num_blocks, page, 1, {width}] (kv_lora_rank + "
                         f"rope_dim = {rank + rope_dim} values), got {tuple(k_cache.shape)}")
    o_lat, lse = attention(q.to(store) if "q" in rounded else q, k_cache, block_table,
                           cache_seqlens, dv=rank, softmax_scale=softmax_scale, causal=causal,
                           dtype=dtype, round_p=store if "p" in rounded else None,
                           kv_format=kv_format, k_descale=k_descale, rope_dim=rope_dim)
    o_used = o_lat.to(store).to(dtype) if "o_lat" in rounded else o_lat
    out = torch.einsum("bshc,hcv->bshv", o_used, weights.w_uv.to(o_lat.device, dtype))
    return out, lse, {"q": q, "o_lat": o_lat}


def _cache_width(k_cache, kv_format, rank: int, rope_dim: int) -> int:
    """The last dimension a cache of kv_format (None: by its dtype) has for rank + rope."""
    if kv_format is None:
        if k_cache.dtype not in (kvformat.FP8, torch.uint8):
            return rank + rope_dim
        kv_format = kvformat.detect(k_cache, rank, rope_dim)
    return kvformat.get(kv_format).width(rank, rope_dim)


def _check_rounded(rounded) -> None:
    bad = [r for r in rounded if r not in ROUNDING_POINTS]
    if bad:
        raise ValueError(f"unknown rounding points {bad}; known: {', '.join(ROUNDING_POINTS)}")


def fused_plain(q_lora: torch.Tensor, weights: FusedWeights, k_cache: torch.Tensor,
                block_table: torch.Tensor, cache_seqlens: torch.Tensor,
                softmax_scale: float, causal: bool = True, rope_dim: int = 64,
                dtype: torch.dtype = torch.float32, kv_format: Optional[str] = None,
                k_descale: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The same operator without absorption: per head K_nope = c_kv @ w_uk[h]^T and
    V = c_kv @ w_uv[h] are formed explicitly (the textbook MLA).  Slow; a cross-check."""
    q_nope, q_pe = _split_query(q_lora, weights, cache_seqlens, rope_dim, dtype)
    b, s_q, h, nope = q_nope.shape
    rank = weights.w_uk.shape[-1]
    _check_weights(weights, nope, rank, h)
    _check_cache(k_cache, block_table, cache_seqlens)
    width = _cache_width(k_cache, kv_format, rank, rope_dim)
    if k_cache.shape[2] != 1 or k_cache.shape[3] != width:
        raise InputError(f"k_cache must be [num_blocks, page, 1, {width}] (kv_lora_rank + "
                         f"rope_dim = {rank + rope_dim} values), got {tuple(k_cache.shape)}")
    decode = _decoder(k_cache, kv_format, k_descale, rank, rank + rope_dim, b)
    if block_table.shape[0] != b:
        raise InputError(f"q_lora has batch {b}, block_table {block_table.shape[0]} rows")
    dev = q_lora.device
    w_uk, w_uv = weights.w_uk.to(dev, dtype), weights.w_uv.to(dev, dtype)
    lens = cache_seqlens.to(dev).long()
    out = torch.zeros(b, s_q, h, w_uv.shape[2], dtype=dtype, device=dev)
    lse = torch.full((b, h, s_q), math.inf, dtype=dtype, device=dev)
    k_cache, block_table = k_cache.to(dev), block_table.to(dev)
    for lo, hi, slots in _chunks(lens, h * (nope + w_uv.shape[2]) + rank + rope_dim):
        if slots == 0:
            continue
        kv, valid = _gather(k_cache, block_table[lo:hi], lens[lo:hi], slots, dtype, decode, lo)
        c_kv, k_pe = kv[:, :, 0, :rank], kv[:, :, 0, rank:]              # [c, t, .]
        k_nope = torch.einsum("btc,hnc->bthn", c_kv, w_uk)
        v = torch.einsum("btc,hcv->bthv", c_kv, w_uv)
        scores = (torch.einsum("bshn,bthn->bhst", q_nope[lo:hi], k_nope)
                  + torch.einsum("bshr,btr->bhst", q_pe[lo:hi], k_pe)) * softmax_scale
        p, lse[lo:hi] = _softmax(scores, _visible(lens[lo:hi], valid, s_q, causal))
        out[lo:hi] = torch.einsum("bhst,bthv->bshv", p, v)
    return out, lse


# ---- dispatch on an MlaInputs -----------------------------------------------------------

def run(inputs: MlaInputs | SparseInputs, dtype: torch.dtype = torch.float32,
        rounded: tuple[str, ...] = ()) -> MlaOutputs:
    """The reference result of a workload: token-sparse attention for SparseInputs, attention
    when q is given, the fused (absorbed) operator when q_lora and weights are.  rounded:
    the kernel's rounding points ("q", "o_lat", "p"; see the module's docstring), e.g.
    ``Backend.rounded`` of its target; a point the operator does not have is ignored.  The fused operator's extra holds its
    absorbed query and latent output, each before its rounding point."""
    _check_rounded(rounded)
    extra: dict = {}
    if "q_e4m3" in rounded or "p_e4m3" in rounded:
        # e4m3 MMAs (a kernel of dense attention)
        if isinstance(inputs, SparseInputs) or inputs.q is None:
            raise InputError("the q_e4m3 / p_e4m3 rounding points are dense attention's")
        q = quantize_q_e4m3(inputs.q) if "q_e4m3" in rounded else inputs.q
        out, lse = attention(q, inputs.k_cache, inputs.block_table, inputs.cache_seqlens,
                             dv=inputs.dv, softmax_scale=inputs.softmax_scale,
                             causal=inputs.causal, dtype=dtype,
                             round_p=torch.float8_e4m3fn if "p_e4m3" in rounded else None,
                             kv_format=inputs.kv_format or None, k_descale=inputs.k_descale)
        return MlaOutputs(out, lse)
    if isinstance(inputs, SparseInputs):
        if inputs.q is None:
            return _fused_sparse(inputs, dtype, rounded)
        out, lse = sparse_attention(inputs.q, inputs.pools, dv=inputs.dv,
                                    softmax_scale=inputs.softmax_scale,
                                    attn_sink=inputs.attn_sink, dtype=dtype,
                                    round_p=inputs.q.dtype if "p" in rounded else None)
        return MlaOutputs(out, lse)
    if inputs.q is not None:
        out, lse = attention(inputs.q, inputs.k_cache, inputs.block_table,
                             inputs.cache_seqlens, dv=inputs.dv,
                             softmax_scale=inputs.softmax_scale, causal=inputs.causal,
                             dtype=dtype, round_p=inputs.q.dtype if "p" in rounded else None,
                             kv_format=inputs.kv_format or None, k_descale=inputs.k_descale)
    elif inputs.q_lora is not None and inputs.weights is not None:
        w = inputs.weights
        rope_dim = w.w_uq.shape[-1] - w.w_uk.shape[1]          # (nope + rope) - nope
        out, lse, extra = _fused_absorbed(inputs.q_lora, w, inputs.k_cache,
                                          inputs.block_table, inputs.cache_seqlens,
                                          inputs.softmax_scale, inputs.causal, rope_dim,
                                          dtype, rounded, inputs.kv_format or None,
                                          inputs.k_descale)
    else:
        raise InputError("MlaInputs needs q (attention) or q_lora and weights (fused)")
    return MlaOutputs(out, lse, extra=extra)


def _fused_sparse(inputs: SparseInputs, dtype: torch.dtype, rounded: tuple[str, ...]
                  ) -> MlaOutputs:
    """The fused operator over token-sparse pools: the absorbed query of q_lora (its tokens
    at each sequence's last s_q positions), sparse attention on the latent pools, W_UV.
    extra: the absorbed query and o_lat, each before its rounding point."""
    if inputs.q_lora is None or inputs.weights is None or inputs.cache_seqlens is None:
        raise InputError("SparseInputs needs q (attention) or q_lora, weights and "
                         "cache_seqlens (fused)")
    w, store = inputs.weights, inputs.q_lora.dtype
    s_q = inputs.q_lora.shape[1]
    if inputs.cache_seqlens.numel() and int(inputs.cache_seqlens.min()) < s_q:
        raise InputError(f"cache_seqlens must be >= s_q = {s_q} (the query tokens' positions "
                         f"are each sequence's last s_q), got {int(inputs.cache_seqlens.min())}")
    rank = w.w_uk.shape[-1]
    rope_dim = w.w_uq.shape[-1] - w.w_uk.shape[1]
    q = absorb_query(inputs.q_lora, w, inputs.cache_seqlens, s_q, rope_dim, dtype)
    o_lat, lse = sparse_attention(q.to(store) if "q" in rounded else q, inputs.pools, dv=rank,
                                  softmax_scale=inputs.softmax_scale,
                                  attn_sink=inputs.attn_sink, dtype=dtype,
                                  round_p=store if "p" in rounded else None, rope_dim=rope_dim)
    o_used = o_lat.to(store).to(dtype) if "o_lat" in rounded else o_lat
    out = torch.einsum("bshc,hcv->bshv", o_used, w.w_uv.to(o_lat.device, dtype))
    return MlaOutputs(out, lse, extra={"q": q, "o_lat": o_lat})
