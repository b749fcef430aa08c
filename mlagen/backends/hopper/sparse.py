"""Token-sparse decode (FlashMLA's sparse decoding at 9241ae3: ``indices``, ``topk_length``,
``attn_sink``) on the wgmma kernels' sparse modes (mla_wgmma_rows.cuh for 16 / 32 rows,
mla_wgmma.cuh for 64, SP = 1), and
FlashMLA's scheduling object of that API (``get_mla_metadata()`` with no arguments).

Each query token has its own index list, so (b, s_q) is flattened into b * s_q one-token
rows: the kernel's "sequence" r is row r's index list (the block table's row), its length
topk_length[b] clipped to topk (or topk), s_q = 1.  The split scheduler and the combine run
unchanged over those lengths.  A slot at or past the cache's num_blocks * page_size makes
its row NaN and sets device error flag 1 (no host sync); a negative one names no key.

A second pool (FlashMLA's extra_k_cache, extra_indices_in_kvcache, extra_topk_length; its own
page size, the main cache's format) joins the same softmax: row r's keys are the main list's
first topk_length[b] (clipped) entries, then the extra list's first extra_topk_length[b], so
the scheduler splits over both pools' keys together and the kernel (SP = 2) gathers each key
from its pool by its position.

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
# the key's width (q's last dimension) -> its 8-bit cache format and that cache's width:
# d_qk 576 (DeepSeek-V3.2) fp8_ds_mla, d_qk 512 (a 448-value latent, DeepSeek-V4's;
# FlashMLA's MODEL1) fp8_ue8m0_paged, whose [blocks, page, 1, 584] view's token stride is no
# token's (kvformat.paged_rows)
D_QK = {576: ("fp8_ds_mla", 656), 512: ("fp8_ue8m0_paged", 584)}
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


# The fewest query tokens (b * s_q) at which 64-row tiles beat 32-row ones, beyond 64 heads
# and at 33-64, for 16-bit and 8-bit pages (H100, s_q 2, topk 2048, the same tensors; the
# 8-bit figures fp8_ds_mla's).  Beyond 64 heads a token's two 64-head tiles gather each key
# twice (8-bit: once a cluster), 32-row tiles 4 times: at 4 tokens of 128 heads 1.05x (bf16)
# and 1.14x (34.2 -> 30.0 us), at 2 tokens 0.94x / 0.98x.  At 33-64 heads one tile a token
# leaves SMs idle where 32-row tiles make two: 64 heads, bf16 0.99x at 8 tokens, 1.04x at 16,
# 1.16x at 32; 8-bit 0.86x at 4, 0.95x at 16, 1.08x at 32.
WIDE_TOKENS = {16: (4, 16), 8: (4, 32)}


def wide_rows(h_q: int, tokens: int, kv: str = "bf16") -> bool:
    """Whether a call of `tokens` query tokens of h_q heads reading `kv` pages takes 64-row
    tiles."""
    beyond, mid = WIDE_TOKENS[16 if kv in ("bf16", "fp16") else 8]
    return h_q > 32 and tokens >= (beyond if h_q > 64 else mid)


@functools.lru_cache(maxsize=64)
def sparse_schedule(h_q: int, kv: str, schedule: Optional[Schedule] = None,
                    wide: bool = False, pools: int = 1, d: int = D) -> Schedule:
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
        if schedule.problem.d != d:
            raise InputError(f"schedule {schedule.name!r} is built for d_qk = "
                             f"{schedule.problem.d} (kv_lora_rank + rope_dim), q has {d}")
        if (2 if schedule.problem.extra_topk else 1) != pools:
            raise InputError(f"schedule {schedule.name!r} reads "
                             f"{'two pools' if schedule.problem.extra_topk else 'one pool'} of "
                             f"keys, this call {'two' if pools == 2 else 'one'} (extra_topk "
                             "in the schedule, extra_k_cache in the call)")
        return defaults.canonical(schedule)
    rows = 16 if h_q <= 16 else (64 if wide and h_q > 32 else 32)
    return defaults.canonical(Schedule.build(
        name=f"hopper_sparse_{kv}", target="hopper", dtype="bf16", kv_format=kv,
        kv_lora_rank=d - 64, rope_dim=64, v_dim=DV,
        attention="sparse", topk=2048, extra_topk=512 if pools == 2 else 0, causal=False,
        rows_per_tile=rows, block_kv=64, buffers=2, warps=8 if rows == 64 else 4,
        mainloop="wgmma"))


@functools.lru_cache(maxsize=64)
def _library(h_q: int, kv: str, schedule: Optional[Schedule], wide: bool = False,
             pools: int = 1, d: int = D) -> tuple[str, int, int, int]:
    s = sparse_schedule(h_q, kv, schedule, wide, pools, d)
    m = s.mapping
    key = ops.library(plan_of(s))
    return key, m.rows_per_tile, 0 if m.split_kv == "auto" else int(m.split_kv), m.split_cost


def check_sparse_inputs(q, k_cache, indices, topk_length, attn_sink, head_dim_v, causal,
                        is_fp8_kvcache, softmax_scale) -> str:
    """Raise InputError for anything the sparse kernel cannot take; return the cache's
    format (bf16, or D_QK's 8-bit one of q's width).  Shape and dtype checks first (they run
    on CPU tensors)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("indices", indices)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor")
    if q.dtype != torch.bfloat16:
        raise InputError(f"sparse decode takes a bfloat16 q, got {q.dtype}")
    if q.dim() != 4 or q.shape[-1] not in D_QK:
        raise InputError(f"q must be [b, s_q, h_q, d_qk] with d_qk 576 or 512, got shape "
                         f"{tuple(q.shape)}")
    b, s_q, h_q, d = q.shape
    fp8, fp8_width = D_QK[d]
    if b < 1 or not 1 <= s_q <= 8 or not 1 <= h_q <= 128:
        raise InputError(f"q is [b = {b}, s_q = {s_q}, h_q = {h_q}, {d}]: b >= 1, s_q in 1..8, "
                         "h_q in 1..128")
    if b * s_q > 8192:
        raise InputError(f"b * s_q = {b * s_q}: at most 8192 query tokens per call")
    if k_cache.dim() != 4 or k_cache.shape[2] != 1:
        raise InputError(f"k_cache must be [num_blocks, page_size, 1, width], got shape "
                         f"{tuple(k_cache.shape)}")
    nb, page, _, width = k_cache.shape
    if k_cache.dtype in _BYTE_DTYPES:
        if width != fp8_width:
            raise InputError(f"an 8-bit k_cache for sparse decode with d_qk {d} is {fp8} "
                             f"({fp8_width} bytes a token), got width {width}")
        kv = fp8
    elif k_cache.dtype == torch.bfloat16:
        if width != d:
            raise InputError(f"a bfloat16 k_cache for q's d_qk {d} must be [..., {d}], got "
                             f"width {width}")
        kv = "bf16"
    else:
        raise InputError(f"sparse decode with d_qk {d} reads bfloat16 or {fp8} (uint8 / "
                         f"float8_e4m3fn [..., {fp8_width}]) caches, got {k_cache.dtype}")
    if bool(is_fp8_kvcache) != (kv == fp8):
        raise InputError(f"is_fp8_kvcache={bool(is_fp8_kvcache)} but k_cache is a {kv} cache")
    if not 1 <= page <= 256 or nb < 1:
        raise InputError(f"k_cache has {nb} blocks of {page} tokens: page size 1..256, at least "
                         "one block")
    if nb * page >= 2 ** 31:
        raise InputError(f"k_cache holds {nb * page} slots: int32 indices reach 2**31 - 1")
    _check_strides("k_cache", k_cache, kv)
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


def _check_strides(name: str, cache: torch.Tensor, kv: str) -> None:
    """A cache's strides the gather can take: 16-byte blocks and tokens; fp8_ue8m0_paged,
    each page's bytes in order (its view's token stride is the view's width) on 16-byte
    page boundaries."""
    if cache.stride(-1) != 1:
        raise InputError(f"{name}'s last dimension must be contiguous (stride 1)")
    if kv == "fp8_ue8m0_paged":
        if cache.stride(1) != cache.shape[3] or cache.stride(0) % 16 \
                or cache.stride(0) < cache.shape[1] * cache.shape[3]:
            raise InputError(f"{name} (fp8_ue8m0_paged) must keep each page's bytes in order "
                             f"(token stride {cache.shape[3]}) on 16-byte page boundaries, got "
                             f"strides {tuple(cache.stride())} (the layout pads each page to "
                             "a multiple of 576 bytes; a contiguous copy of the view drops it, "
                             "which an odd page size needs)")
        return
    per16 = 16 // cache.element_size()
    if cache.stride(0) % per16 or cache.stride(1) % per16:
        raise InputError(f"{name}'s block and token strides must be multiples of 16 bytes")


def _length_vector(name: str, t, b: int) -> None:
    if t is not None and not (isinstance(t, torch.Tensor) and t.dtype == torch.int32
                              and tuple(t.shape) == (b,)):
        what = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise InputError(f"{name} must be int32 [b = {b}], got {what}")


def check_extra_inputs(q, k_cache, extra_k_cache, extra_indices, extra_topk_length) -> None:
    """Raise InputError for a second pool the sparse kernel cannot take (after
    check_sparse_inputs has passed the main pool): the main cache's format, its own page
    size, indices int32 [b, s_q, extra_topk]."""
    if extra_k_cache is None or extra_indices is None:
        given = [n for n, t in (("extra_k_cache", extra_k_cache),
                                ("extra_indices_in_kvcache", extra_indices),
                                ("extra_topk_length", extra_topk_length)) if t is not None]
        raise InputError(f"{' and '.join(given)} given alone: a second pool takes "
                         "extra_k_cache and extra_indices_in_kvcache (extra_topk_length "
                         "optional)")
    for name, t in (("extra_k_cache", extra_k_cache), ("extra_indices_in_kvcache", extra_indices)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor")
    b, s_q = q.shape[:2]
    if extra_k_cache.dim() != 4 or extra_k_cache.shape[2] != 1:
        raise InputError(f"extra_k_cache must be [num_blocks, page_size, 1, width], got shape "
                         f"{tuple(extra_k_cache.shape)}")
    nb, page, _, width = extra_k_cache.shape
    if (extra_k_cache.dtype in _BYTE_DTYPES) != (k_cache.dtype in _BYTE_DTYPES) \
            or (k_cache.dtype == torch.bfloat16) != (extra_k_cache.dtype == torch.bfloat16) \
            or width != k_cache.shape[3]:
        raise InputError(f"extra_k_cache is {extra_k_cache.dtype} [..., {width}] but k_cache "
                         f"{k_cache.dtype} [..., {k_cache.shape[3]}]: both pools in one format")
    if not 1 <= page <= 256 or nb < 1:
        raise InputError(f"extra_k_cache has {nb} blocks of {page} tokens: page size 1..256, "
                         "at least one block")
    if nb * page >= 2 ** 31:
        raise InputError(f"extra_k_cache holds {nb * page} slots: int32 indices reach "
                         "2**31 - 1")
    _check_strides("extra_k_cache", extra_k_cache,
                   "bf16" if extra_k_cache.dtype == torch.bfloat16 else D_QK[q.shape[-1]][0])
    if extra_indices.dtype != torch.int32 or extra_indices.dim() != 3 \
            or tuple(extra_indices.shape[:2]) != (b, s_q):
        raise InputError(f"extra_indices_in_kvcache must be int32 [b = {b}, s_q = {s_q}, "
                         f"extra_topk], got {extra_indices.dtype} {tuple(extra_indices.shape)}")
    if extra_indices.shape[2] < 1:
        raise InputError("extra_indices_in_kvcache has extra_topk = 0 entries per query token "
                         "(no second pool: leave the extra arguments out)")
    _length_vector("extra_topk_length", extra_topk_length, b)


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
    """The kernel's length of each flattened row: topk_length[b] clipped to topk, or topk,
    as b * s_q contiguous ints.  The statement in torch of what the call's one launch
    computes (DecodePlan.sparse_lengths; tests compare the two)."""
    if topk_length is None:
        return torch.full((b * s_q,), topk, dtype=torch.int32, device=device)
    return torch.repeat_interleave(topk_length.clamp(max=topk).to(torch.int32), s_q)


def _tensor_sig(t) -> Optional[tuple]:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def two_pool_lengths(main: torch.Tensor, extra: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(each row's key count over both pools, its main-list length): the kernel's seqlens
    and len1 from row_lengths of each pool, in torch (the call launches
    DecodePlan.sparse_lengths).  A negative length in either pool makes the count
    negative, so the kernel flags the row (kErrorBadLength)."""
    bad = (main < 0) | (extra < 0)
    total = torch.where(bad, torch.full_like(main, -1), main + extra)
    return total, main


def sparse_decode(q, k_cache, indices, topk_length, attn_sink, sched: FlashMLASchedMeta,
                  head_dim_v=DV, softmax_scale=None, causal=False, is_fp8_kvcache=False,
                  schedule: Optional[Schedule] = None, extra_k_cache=None, extra_indices=None,
                  extra_topk_length=None) -> tuple[torch.Tensor, torch.Tensor]:
    """One sparse decode step: (out [b, s_q, h_q, 512] bf16, lse fp32 [b, h_q, s_q])."""
    extra = (extra_k_cache, extra_indices, extra_topk_length)
    pools = 2 if any(t is not None for t in extra) else 1
    sig = None
    try:
        sig = (q.shape, q.stride(), q.dtype, q.device, k_cache.shape, k_cache.stride(),
               k_cache.dtype, k_cache.device, indices.shape, indices.stride(), indices.dtype,
               _tensor_sig(topk_length), _tensor_sig(attn_sink),
               head_dim_v, softmax_scale, bool(causal), bool(is_fp8_kvcache), schedule,
               *(_tensor_sig(t) for t in extra))
        plan = _PLANS.get(sig)
    except (AttributeError, TypeError):
        plan = None
    if plan is None:
        kv = check_sparse_inputs(q, k_cache, indices, topk_length, attn_sink, head_dim_v,
                                 causal, is_fp8_kvcache, softmax_scale)
        if pools == 2:
            check_extra_inputs(q, k_cache, *extra)
        _on_one_cuda({"q": q, "k_cache": k_cache, "indices": indices,
                      "topk_length": topk_length, "attn_sink": attn_sink,
                      "extra_k_cache": extra_k_cache, "extra_indices_in_kvcache": extra_indices,
                      "extra_topk_length": extra_topk_length})
        b, s_q, h_q, d = q.shape
        key, rows, fixed, cost = _library(h_q, kv, schedule, wide_rows(h_q, b * s_q, kv), pools, d)
        if fixed:
            parts = b * s_q * fixed
        else:
            slots = ops.sm_count(q.device) * ops.get(key).ctas_per_sm()
            parts = scheduler.num_parts(slots, h_q, rows)
            if rows == 64 and h_q > 64:   # two tiles a token: the clusters that fit at once
                parts = ops.get(key).cluster_parts(parts)
        scale = float(softmax_scale) if softmax_scale is not None else d ** -0.5
        plan = _SparsePlan(q, k_cache, indices, key, parts, fixed, cost, scale,
                           extra_k_cache, extra_indices)
        if sig is not None and (softmax_scale is None or isinstance(softmax_scale, (int, float))):
            if len(_PLANS) >= _PLAN_LIMIT:
                _PLANS.clear()
            _PLANS[sig] = plan
    return plan.run(q, k_cache, indices, topk_length, attn_sink, sched, *extra)


class _SparsePlan:
    """What stays fixed for one sparse call signature: the library, the split and the
    flattened launch's DecodePlan."""

    def __init__(self, q, k_cache, indices, key, parts, fixed, cost, scale,
                 extra_k_cache=None, extra_indices=None):
        b, s_q, h_q, d = q.shape
        self.b, self.s_q, self.h_q, self.d, self.topk = b, s_q, h_q, d, indices.shape[2]
        self.key, self.parts, self.fixed, self.cost = key, parts, fixed, cost
        self.extra_topk = 0 if extra_indices is None else extra_indices.shape[2]
        self.config = ("sparse", b, s_q, h_q, k_cache.shape[1], self.topk, key)
        self.extra_shape = None
        if self.extra_topk:
            self.config += (extra_k_cache.shape[1], self.extra_topk)
            self.extra_shape = ops.extra_shape(extra_k_cache, self.extra_topk)
        q1 = q.reshape(b * s_q, 1, h_q, d)
        i1 = indices.reshape(b * s_q, self.topk)
        self.decode = ops.DecodePlan(q1, k_cache, i1, parts, scale, False, key)

    def metadata(self, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.get_mla_metadata_impl(lens, self.parts, self.fixed, self.key, self.cost)

    def run(self, q, k_cache, indices, topk_length, attn_sink, sched, extra_k_cache=None,
            extra_indices=None, extra_topk_length=None):
        b, s_q, h_q, topk = self.b, self.s_q, self.h_q, self.topk
        q1 = q.reshape(b * s_q, 1, h_q, self.d)
        i1 = indices.reshape(b * s_q, topk)
        if q1.stride(-1) != 1 or any(st % 8 for st in q1.stride()[:3]):
            q1 = q1.contiguous()
        if i1.stride(-1) != 1 or i1.stride(0) != topk:
            i1 = i1.contiguous()
        xk = self.extra_topk
        # one launch (row_lengths and two_pool_lengths say what it computes)
        lens, len1 = self.decode.sparse_lengths(topk_length, extra_topk_length, s_q, topk, xk)
        extra = None
        if xk:
            x1 = extra_indices.reshape(b * s_q, xk)
            if x1.stride(-1) != 1 or x1.stride(0) != xk:
                x1 = x1.contiguous()     # extra_shape's idx2_stride is extra_topk
            extra = (self.extra_shape, extra_k_cache, x1, len1)
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
        out, lse = self.decode.run(q1, k_cache, i1, lens, md, ns, sink=sink, extra=extra)
        out = out.view(b, s_q, h_q, DV)
        lse = lse.view(b, s_q, h_q).transpose(1, 2)
        if s_q > 1:
            lse = lse.contiguous()
        return out, lse
