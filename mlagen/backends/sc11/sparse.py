"""The SC11 kernel's token-sparse inputs: checks with clear messages, and the C ABI's
arguments (templates/sc11/runtime/abi.h, the sparse fields).

A sparse SC11 variant reads SparseInputs (mlagen.problem): q, the main pool (k_cache in the
schedule's page_size and kv_format, indices [b, s_q, topk], topk_length) and, with
extra_topk, a second pool in its own page size; sinks [h] fp32 when the schedule has them.
"""

from __future__ import annotations

import math

import torch

from ... import kvformat
from ...errors import InputError
from ...problem import TORCH_DTYPES, SparseInputs
from ...schedule.records import Schedule


def validate_sparse(s: Schedule, inp: SparseInputs) -> None:
    """Raise InputError (naming the variant) for what the kernel cannot run on."""
    p = s.problem
    h = s.heads_per_device
    dt = TORCH_DTYPES[p.dtype]

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise InputError(f"{s.variant_name()}: {msg}")

    def tensor(name: str, t, shape: tuple, dtypes) -> None:
        dtypes = dtypes if isinstance(dtypes, tuple) else (dtypes,)
        need(isinstance(t, torch.Tensor), f"{name} must be a tensor")
        need(t.device.type == "cpu", f"{name} is on {t.device}; the emulator runs on the CPU")
        need(t.dtype in dtypes, f"{name} has dtype {t.dtype}; expected "
                                f"{' or '.join(str(d) for d in dtypes)}")
        need(tuple(t.shape) == shape, f"{name} has shape {tuple(t.shape)}; expected {shape}")

    if p.fused:
        # phase A: q_lora through the weights, its tokens at each sequence's last s_q
        # positions (cache_seqlens), as the dense fused operator
        ql = inp.q_lora
        need(inp.q is None and isinstance(ql, torch.Tensor) and ql.dim() == 3
             and inp.weights is not None,
             f"the fused operator needs q_lora [batch, s_q, {p.q_lora_rank}] and weights "
             f"(not q)")
        b, s_q = ql.shape[0], ql.shape[1]
        need(b >= 1, "batch must be >= 1")
        need(1 <= s_q <= p.max_s_q, f"s_q = {s_q} must be between 1 and max_s_q = {p.max_s_q}")
        tensor("q_lora", ql, (b, s_q, p.q_lora_rank), dt)
        w = inp.weights
        tensor("w_uq", w.w_uq, (p.q_lora_rank, h, p.qk_nope_head_dim + p.rope_dim), dt)
        tensor("w_uk", w.w_uk, (h, p.qk_nope_head_dim, p.kv_lora_rank), dt)
        tensor("w_uv", w.w_uv, (h, p.kv_lora_rank, p.v_head_dim), dt)
        tensor("cache_seqlens", inp.cache_seqlens, (b,), torch.int32)
        low = int(inp.cache_seqlens.min())
        need(low >= s_q, f"cache_seqlens must be >= s_q = {s_q} (the query tokens take each "
                         f"sequence's last s_q positions), got {low}")
    else:
        q = inp.q
        need(isinstance(q, torch.Tensor) and q.dim() == 4,
             f"q must be [batch, s_q, {h}, {p.d}]")
        b, s_q = q.shape[0], q.shape[1]
        need(b >= 1, "batch must be >= 1")
        need(1 <= s_q <= p.max_s_q, f"s_q = {s_q} must be between 1 and max_s_q = {p.max_s_q}")
        tensor("q", q, (b, s_q, h, p.d), dt)
    need(inp.dv == p.dv, f"dv = {inp.dv}; the schedule's V width is {p.dv}")
    need(inp.softmax_scale is not None and inp.softmax_scale > 0
         and math.isfinite(inp.softmax_scale), "softmax_scale must be a finite number > 0")
    want = 2 if p.extra_topk else 1
    need(len(inp.pools) == want, f"{len(inp.pools)} pools given; the schedule has {want} "
                                 f"(extra_topk = {p.extra_topk})")
    specs = [("pool 0", p.page_size, p.kv, p.topk)]
    if p.extra_topk:
        specs.append(("pool 1 (extra)", p.extra_page_size or p.page_size, p.extra_kv,
                      p.extra_topk))
    for pool, (name, page, fmt_name, topk) in zip(inp.pools, specs):
        fmt = kvformat.get(fmt_name)
        width = fmt.width(p.kv_lora_rank, p.rope_dim)
        kc = pool.k_cache
        need(isinstance(kc, torch.Tensor) and kc.dim() == 4,
             f"{name}: k_cache must be [blocks, {page}, 1, {width}]")
        need(pool.kv_format in (None, "", fmt_name),
             f"{name}: its cache is {pool.kv_format}; the schedule says {fmt_name}")
        tensor(f"{name} k_cache", kc, (kc.shape[0], page, 1, width),
               (kvformat.FP8, torch.uint8) if fmt.quantized else dt)
        need(pool.k_descale is None, f"{name}: k_descale is for fp8_e4m3 caches")
        tensor(f"{name} indices", pool.indices, (b, s_q, topk), torch.int32)
        cap = kc.shape[0] * page
        if pool.indices.numel():
            top = int(pool.indices.max())
            need(top < cap, f"{name}: indices name slot {top}; the cache holds {cap} "
                            f"({kc.shape[0]} pages of {page})")
        tl = pool.topk_length
        if tl is not None:
            tensor(f"{name} topk_length", tl, (b,), torch.int32)
            need(int(tl.min()) >= 0, f"{name}: topk_length must be >= 0, got {int(tl.min())}")
    if p.sinks:
        need(inp.attn_sink is not None, "the schedule has sinks: attn_sink [heads] is needed")
        tensor("attn_sink", inp.attn_sink, (h,), torch.float32)
    else:
        need(inp.attn_sink is None, "attn_sink given but the schedule has sinks = false")


def kernel_cache(kc: torch.Tensor, fmt_name: str, rank: int) -> torch.Tensor:
    """A pool's cache as the kernel addresses it: the tensor itself, or for a page-major
    format (fp8_ue8m0_paged) its pages uint8 [blocks, page bytes rounded up to 576], each
    page's data rows then its scale rows (kvformat.paged_rows), whatever the caller's block
    stride."""
    if not kvformat.get(fmt_name).paged:
        return kc
    blocks, page, _, width = kc.shape
    stride = -(-page * width // kvformat.PAGED_ALIGN) * kvformat.PAGED_ALIGN
    data, scales = kvformat.paged_rows(kc, rank)
    buf = torch.zeros(blocks, stride, dtype=torch.uint8)
    n = data.shape[1] * data.shape[2]
    buf[:, :n] = data.reshape(blocks, n)
    buf[:, n:n + scales.shape[1] * scales.shape[2]] = scales.reshape(blocks, -1)
    return buf


def sparse_args(args_type, inp: SparseInputs, c, out, lse, scheme_id: int,
                threads, problem, rope: dict) -> object:
    """The C ABI's argument record of a sparse run; c(t) keeps a contiguous copy alive and
    returns its address.  problem: the schedule's (its pools' formats and kv_lora_rank);
    rope: the rotary table's fields (the fused operator's; empty ones otherwise)."""
    main = inp.pools[0]
    extra = inp.pools[1] if len(inp.pools) > 1 else None
    b, s_q = inp.rows
    rank = problem.kv_lora_rank
    w = inp.weights if problem.fused else None
    ptr = lambda t: None if t is None else t.data_ptr()   # noqa: E731
    return args_type(
        batch=b, s_q=s_q, num_blocks=main.k_cache.shape[0], max_blocks=0, scheme=scheme_id,
        causal=0, threads=int(threads or 0), scale=float(inp.softmax_scale),
        **rope, q=None if w else c(inp.q), q_lora=c(inp.q_lora) if w else None,
        w_uq=c(w.w_uq) if w else None, w_uk=c(w.w_uk) if w else None,
        w_uv=c(w.w_uv) if w else None,
        k_cache=c(kernel_cache(main.k_cache, problem.kv, rank)), block_table=None,
        seqlens=c(inp.cache_seqlens) if w else None,
        out=ptr(out), lse=ptr(lse), k_descale=None, descale_n=0,
        indices=c(main.indices), topk_length=c(main.topk_length),
        extra_k_cache=c(kernel_cache(extra.k_cache, problem.extra_kv, rank)) if extra else None,
        extra_indices=c(extra.indices) if extra else None,
        extra_topk_length=c(extra.topk_length) if extra else None,
        extra_num_blocks=extra.k_cache.shape[0] if extra else 0,
        attn_sink=c(inp.attn_sink))
