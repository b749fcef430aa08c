"""Token-sparse decode (FlashMLA's sparse decoding at 9241ae3: ``indices``, ``topk_length``,
``attn_sink``) on the wgmma kernels' sparse modes (mla_wgmma_rows.cuh for 16 / 32 rows,
mla_wgmma.cuh for 64, SP = 1), and
FlashMLA's scheduling object of that API (``get_mla_metadata()`` with no arguments).

Each query token has its own index list, so (b, s_q) is flattened into b * s_q one-token
rows: the kernel's "sequence" r is row r's index list (the block table's row), its length
topk_length[b] clipped to topk (or topk), s_q = 1.  The split scheduler and the combine run
unchanged over those lengths.  A slot at or past the cache's num_blocks * page_size makes
its row NaN and sets device error flag 1 (no host sync); a negative one names no key.

attn_sink scales the output by exp(lse) / (exp(lse) + exp(sink[h])) in the kernel, where the
row is still fp32 (the direct epilogue or the combine; lse unchanged; +inf gives 0); a row
with no key gets out 0 and lse +inf.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from mlagen.errors import InputError
from mlagen.schedule.records import Schedule
from mlagen.schedule.rules import plan_of

from . import defaults, ops, scheduler

D, DV = 576, 512
_SPARSE_FORMATS = {576: "bf16", 656: "fp8_ds_mla"}   # the cache's last dimension -> format
_BYTE_DTYPES = (torch.float8_e4m3fn, torch.uint8)
_PLANS: dict = {}
_PLAN_LIMIT = 4096


@dataclass
class FlashMLASchedMeta:
    """FlashMLA's scheduling object (9241ae3): made empty by ``get_mla_metadata()``, filled
    by the first ``flash_mla_with_kvcache`` call that takes it, reused by later calls of the
    same shapes and the same lengths (cache_seqlens / topk_length values), as FlashMLA's."""

    have_initialized: bool = False
    config: Optional[tuple] = None                     # what the metadata was made for
    tile_scheduler_metadata: Optional[torch.Tensor] = None
    num_splits: Optional[torch.Tensor] = None


# 64-row tiles once a call has this many (query token, 64-head tile) pairs: on the H200
# (benchmarks/hopper_sparse_tiles.py) they are 0.96x the 32-row tiles at 4 tokens of 128
# heads, 1.15-1.5x from 16 pairs up (h_q 48-128, fp8_ds_mla)
WIDE_PAIRS = 16


def wide_rows(h_q: int, tokens: int) -> bool:
    """Whether a call of `tokens` query tokens (b * s_q) of h_q heads takes 64-row tiles."""
    return h_q > 32 and tokens * -(-h_q // 64) >= WIDE_PAIRS


@functools.lru_cache(maxsize=64)
def sparse_schedule(h_q: int, kv: str, schedule: Optional[Schedule] = None,
                    wide: bool = False) -> Schedule:
    """The canonical sparse schedule of a call: the caller's (checked: sparse, its format),
    else 16-row tiles up to 16 heads, 32-row tiles up to 32, and beyond 32 heads the 64-row
    kernel's sparse mode where `wide` (wide_rows: enough tokens to fill the device;
    mla_wgmma.cuh: a token's 64 or 128 heads gather each key once or twice, not 2-4
    times), else 32-row tiles."""
    if schedule is not None:
        if schedule.target.kind != "hopper" or schedule.problem.attention != "sparse":
            raise InputError(f"schedule {schedule.name!r} is not a hopper attention = "
                             "\"sparse\" schedule (indices= needs one)")
        if schedule.problem.kv != kv:
            raise InputError(f"schedule {schedule.name!r} reads {schedule.problem.kv} caches, "
                             f"this k_cache is {kv}")
        return defaults.canonical(schedule)
    rows = 16 if h_q <= 16 else (64 if wide and h_q > 32 else 32)
    return defaults.canonical(Schedule.build(
        name=f"hopper_sparse_{kv}", target="hopper", dtype="bf16", kv_format=kv,
        attention="sparse", topk=2048, causal=False, rows_per_tile=rows, block_kv=64,
        buffers=2, warps=8 if rows == 64 else 4, mainloop="wgmma"))


@functools.lru_cache(maxsize=64)
def _library(h_q: int, kv: str, schedule: Optional[Schedule],
             wide: bool = False) -> tuple[str, int, int, int]:
    s = sparse_schedule(h_q, kv, schedule, wide)
    m = s.mapping
    key = ops.library(plan_of(s))
    return key, m.rows_per_tile, 0 if m.split_kv == "auto" else int(m.split_kv), m.split_cost


def check_sparse_inputs(q, k_cache, indices, topk_length, attn_sink, head_dim_v, causal,
                        is_fp8_kvcache, softmax_scale) -> str:
    """Raise InputError for anything the sparse kernel cannot take; return the cache's
    format (bf16 or fp8_ds_mla).  Shape and dtype checks first (they run on CPU tensors)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("indices", indices)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor")
    if q.dtype != torch.bfloat16:
        raise InputError(f"sparse decode takes a bfloat16 q, got {q.dtype}")
    if q.dim() != 4 or q.shape[-1] != D:
        raise InputError(f"q must be [b, s_q, h_q, {D}], got shape {tuple(q.shape)}")
    b, s_q, h_q, _ = q.shape
    if b < 1 or not 1 <= s_q <= 8 or not 1 <= h_q <= 128:
        raise InputError(f"q is [b = {b}, s_q = {s_q}, h_q = {h_q}, {D}]: b >= 1, s_q in 1..8, "
                         "h_q in 1..128")
    if b * s_q > 8192:
        raise InputError(f"b * s_q = {b * s_q}: at most 8192 query tokens per call")
    if k_cache.dim() != 4 or k_cache.shape[2] != 1:
        raise InputError(f"k_cache must be [num_blocks, page_size, 1, width], got shape "
                         f"{tuple(k_cache.shape)}")
    nb, page, _, width = k_cache.shape
    if k_cache.dtype in _BYTE_DTYPES:
        if width != 656:
            raise InputError(f"an 8-bit k_cache for sparse decode is fp8_ds_mla (656 bytes a "
                             f"token), got width {width}")
        kv = "fp8_ds_mla"
    elif k_cache.dtype == torch.bfloat16:
        if width != D:
            raise InputError(f"a bfloat16 k_cache must be [..., {D}], got width {width}")
        kv = "bf16"
    else:
        raise InputError(f"sparse decode reads bfloat16 or fp8_ds_mla (uint8 / float8_e4m3fn "
                         f"[..., 656]) caches, got {k_cache.dtype}")
    if bool(is_fp8_kvcache) != (kv == "fp8_ds_mla"):
        raise InputError(f"is_fp8_kvcache={bool(is_fp8_kvcache)} but k_cache is a {kv} cache")
    if not 1 <= page <= 256 or nb < 1:
        raise InputError(f"k_cache has {nb} blocks of {page} tokens: page size 1..256, at least "
                         "one block")
    if nb * page >= 2 ** 31:
        raise InputError(f"k_cache holds {nb * page} slots: int32 indices reach 2**31 - 1")
    if k_cache.stride(-1) != 1:
        raise InputError("k_cache's last dimension must be contiguous (stride 1)")
    per16 = 16 // k_cache.element_size()
    if k_cache.stride(0) % per16 or k_cache.stride(1) % per16:
        raise InputError("k_cache's block and token strides must be multiples of 16 bytes")
    if head_dim_v != DV:
        raise InputError(f"head_dim_v = {head_dim_v}: the kernels are built for {DV}")
    if causal:
        raise InputError("causal must be False when indices are given (sparse attention "
                         "names its keys)")
    if indices.dtype != torch.int32 or indices.dim() != 3 or tuple(indices.shape[:2]) != (b, s_q):
        raise InputError(f"indices must be int32 [b = {b}, s_q = {s_q}, topk], got "
                         f"{indices.dtype} {tuple(indices.shape)}")
    if indices.shape[2] < 1:
        raise InputError("indices has topk = 0 entries per query token")
    if topk_length is not None:
        if not (isinstance(topk_length, torch.Tensor) and topk_length.dtype == torch.int32
                and tuple(topk_length.shape) == (b,)):
            what = (f"{topk_length.dtype} {tuple(topk_length.shape)}"
                    if isinstance(topk_length, torch.Tensor) else type(topk_length).__name__)
            raise InputError(f"topk_length must be int32 [b = {b}], got {what}")
    if attn_sink is not None:
        if not (isinstance(attn_sink, torch.Tensor) and attn_sink.dtype == torch.float32
                and tuple(attn_sink.shape) == (h_q,)):
            what = (f"{attn_sink.dtype} {tuple(attn_sink.shape)}"
                    if isinstance(attn_sink, torch.Tensor) else type(attn_sink).__name__)
            raise InputError(f"attn_sink must be fp32 [h_q = {h_q}], got {what}")
    if softmax_scale is not None:
        if not (float(softmax_scale) > 0 and float(softmax_scale) != float("inf")):
            raise InputError(f"softmax_scale = {softmax_scale} must be a positive finite number")
    return kv


def _on_one_cuda(named: dict) -> None:
    dev = None
    for name, t in named.items():
        if t is None:
            continue
        if not t.is_cuda:
            raise InputError(f"{name} must be on a CUDA device, got {t.device}")
        if dev is None:
            dev = t.device
        elif t.device != dev:
            raise InputError(f"{name} is on {t.device} but the other inputs on {dev}")


def row_lengths(topk_length: Optional[torch.Tensor], b: int, s_q: int, topk: int,
                device) -> torch.Tensor:
    """The kernel's length of each flattened row: topk_length[b] clipped to topk, or topk
    (device ops only: no sync).  A new contiguous tensor of b * s_q ints: the scheduler
    reads it by pointer (an expand + reshape is a stride-0 view when b = 1, and the kernel
    read past its one int)."""
    if topk_length is None:
        return torch.full((b * s_q,), topk, dtype=torch.int32, device=device)
    return torch.repeat_interleave(topk_length.clamp(max=topk).to(torch.int32), s_q)


def sparse_decode(q, k_cache, indices, topk_length, attn_sink, sched: FlashMLASchedMeta,
                  head_dim_v=DV, softmax_scale=None, causal=False, is_fp8_kvcache=False,
                  schedule: Optional[Schedule] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One sparse decode step: (out [b, s_q, h_q, 512] bf16, lse fp32 [b, h_q, s_q])."""
    sig = None
    try:
        sig = (q.shape, q.stride(), q.dtype, q.device, k_cache.shape, k_cache.stride(),
               k_cache.dtype, k_cache.device, indices.shape, indices.stride(), indices.dtype,
               None if topk_length is None else (topk_length.shape, topk_length.dtype),
               None if attn_sink is None else (attn_sink.shape, attn_sink.dtype),
               head_dim_v, softmax_scale, bool(causal), bool(is_fp8_kvcache), schedule)
        plan = _PLANS.get(sig)
    except (AttributeError, TypeError):
        plan = None
    if plan is None:
        kv = check_sparse_inputs(q, k_cache, indices, topk_length, attn_sink, head_dim_v,
                                 causal, is_fp8_kvcache, softmax_scale)
        _on_one_cuda({"q": q, "k_cache": k_cache, "indices": indices,
                      "topk_length": topk_length, "attn_sink": attn_sink})
        b, s_q, h_q, _ = q.shape
        key, rows, fixed, cost = _library(h_q, kv, schedule, wide_rows(h_q, b * s_q))
        if fixed:
            parts = b * s_q * fixed
        else:
            slots = ops.sm_count(q.device) * ops.get(key).ctas_per_sm()
            parts = scheduler.num_parts(slots, h_q, rows)
        scale = float(softmax_scale) if softmax_scale is not None else D ** -0.5
        plan = _SparsePlan(q, k_cache, indices, key, parts, fixed, cost, scale)
        if sig is not None and (softmax_scale is None or isinstance(softmax_scale, (int, float))):
            if len(_PLANS) >= _PLAN_LIMIT:
                _PLANS.clear()
            _PLANS[sig] = plan
    return plan.run(q, k_cache, indices, topk_length, attn_sink, sched)


class _SparsePlan:
    """What stays fixed for one sparse call signature: the library, the split and the
    flattened launch's DecodePlan."""

    def __init__(self, q, k_cache, indices, key, parts, fixed, cost, scale):
        b, s_q, h_q, _ = q.shape
        self.b, self.s_q, self.h_q, self.topk = b, s_q, h_q, indices.shape[2]
        self.key, self.parts, self.fixed, self.cost = key, parts, fixed, cost
        self.config = ("sparse", b, s_q, h_q, k_cache.shape[1], self.topk, key)
        q1 = q.reshape(b * s_q, 1, h_q, D)
        i1 = indices.reshape(b * s_q, self.topk)
        self.decode = ops.DecodePlan(q1, k_cache, i1, parts, scale, False, key)

    def metadata(self, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.get_mla_metadata_impl(lens, self.parts, self.fixed, self.key, self.cost)

    def run(self, q, k_cache, indices, topk_length, attn_sink, sched):
        b, s_q, h_q, topk = self.b, self.s_q, self.h_q, self.topk
        q1 = q.reshape(b * s_q, 1, h_q, D)
        i1 = indices.reshape(b * s_q, topk)
        if q1.stride(-1) != 1 or any(st % 8 for st in q1.stride()[:3]):
            q1 = q1.contiguous()
        if i1.stride(-1) != 1 or i1.stride(0) != topk:
            i1 = i1.contiguous()
        lens = row_lengths(topk_length, b, s_q, topk, q.device)
        if sched is None or not sched.have_initialized:
            md, ns = self.metadata(lens)
            if sched is not None:
                sched.have_initialized = True
                sched.config = self.config
                sched.tile_scheduler_metadata, sched.num_splits = md, ns
        else:
            if sched.config != self.config:
                raise InputError(f"tile_scheduler_metadata was filled for {sched.config}, this "
                                 f"call is {self.config}: one FlashMLASchedMeta per shape "
                                 "(get_mla_metadata() again)")
            md, ns = sched.tile_scheduler_metadata, sched.num_splits
        sink = None if attn_sink is None else attn_sink.contiguous()   # read by pointer
        out, lse = self.decode.run(q1, k_cache, i1, lens, md, ns, sink=sink)
        out = out.view(b, s_q, h_q, DV)
        lse = lse.view(b, s_q, h_q).transpose(1, 2)
        if s_q > 1:
            lse = lse.contiguous()
        return out, lse
