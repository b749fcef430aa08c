"""Token-sparse attention for model code: the keys each query row attends to, named as
FlashMLA's sparse decode names them (slot = page * page_size + offset, -1 none), and the
attention over one or two pools of such keys, on a target kind or in torch.

    dec = SparseLatentDecoder(weights, softmax_scale, target="torch")
    out = dec(q_lora, k_cache, block_table, cache_seqlens, indices)   # [b, s_q, h, v_head_dim]

    slots = visible_slots(columns, visible, block_table, page, cache_seqlens, n_columns)
    idx, _ = compact(torch.where(visible, slots, -1))   # the valid entries first, topk trimmed

SparseLatentDecoder absorbs the query (mlagen.reference.absorb_query: q_nope @ W_UK | rope
of q_pe), attends on the latent cache's named slots (V = the first kv_lora_rank values of
each key) and projects the latent output with W_UV.  A target whose backend offers the
FlashMLA-compatible call (``flash_mla_with_kvcache(..., indices=)``, FlashMLA's interface at
9241ae3) runs decode steps (s_q <= max_s_q) through it; a target that generates sparse
kernels from schedules (its backend's ``attentions`` has "sparse": the emulated card) runs them through
ScheduleRunner (one schedule a topk and format, compiled on first use); every other step,
and every step of the "torch" target, runs mlagen.reference.sparse_attention in fp32 (the
one sparse reference: invalid and repeated entries, topk_length, sinks, two pools).
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import reference
from ..backends import backend, kinds
from ..errors import InputError
from ..problem import FusedWeights, SparseInputs, SparsePool, slots_of

__all__ = ["SparseLatentDecoder", "ScheduleRunner", "visible_slots", "compact", "pad_topk",
           "SPARSE_CALL", "TOPK_ALIGN"]

SPARSE_CALL = "flash_mla_with_kvcache"
# FlashMLA's SM90 sparse decode takes topk in multiples of 64 (TOPK_BLOCK_SIZE, its
# csrc/sm90/decode/sparse_fp8/config.h at 9241ae3); the kernel call pads with -1 to it
TOPK_ALIGN = 64


def visible_slots(columns: torch.Tensor, visible: torch.Tensor, block_table: torch.Tensor,
                  page: int, cache_seqlens: torch.Tensor, n_columns: int) -> torch.Tensor:
    """Model columns [b, s_q, k] (a model numbers its key columns with each row's pads
    first: row i's tokens are its last cache_seqlens[i] of n_columns) -> cache slots, -1
    where the entry is not visible ([b, s_q, k] bool) or names no token of the row."""
    lens = cache_seqlens.to(columns.device).long()[:, None, None]
    pos = columns.long() - (n_columns - lens)
    ok = visible & (pos >= 0) & (pos < lens)
    return slots_of(torch.where(ok, pos, -1), block_table.to(columns.device), page)


def compact(indices: torch.Tensor, multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's valid entries (>= 0) first in their order, -1 after, the last dim cut to
    the longest row's count rounded up to `multiple` (at least one entry); and the count of
    valid entries per row [b, s_q]."""
    valid = indices >= 0
    count = valid.sum(-1)
    order = torch.sort((~valid).to(torch.int8), dim=-1, stable=True).indices
    packed = torch.gather(indices, -1, order)
    k = max(1, int(count.max()) if count.numel() else 1)
    k = -(-k // multiple) * multiple
    if k > packed.shape[-1]:
        pad = packed.new_full((*packed.shape[:-1], k - packed.shape[-1]), -1)
        packed = torch.cat((packed, pad), dim=-1)
    return packed[..., :k].to(torch.int32).contiguous(), count


def sparse_schedules(target: str) -> bool:
    """Does the target generate token-sparse kernels from schedules (attention = "sparse")?"""
    return target != "torch" and target in kinds() \
        and "sparse" in getattr(backend(target), "attentions", ())


def pad_topk(indices: torch.Tensor, topk: int) -> torch.Tensor:
    """indices [b, s_q, k] packed valid first (compact) and padded with -1 to exactly topk."""
    idx, _ = compact(indices)
    if idx.shape[-1] > topk:
        raise InputError(f"{idx.shape[-1]} keys named per query; the kernel takes {topk}")
    pad = idx.new_full((*idx.shape[:-1], topk - idx.shape[-1]), -1)
    return torch.cat((idx, pad), dim=-1).contiguous()


class ScheduleRunner:
    """Steps through a target's generated sparse kernel (attention = "sparse"): the model's
    fixed problem knobs (heads, dims, page sizes, dtype, max_s_q) plus each call's (topk,
    formats, ...); one schedule, built and compiled on first use (mlagen.runner), a distinct
    set of call knobs."""

    def __init__(self, target: str, **fixed):
        self.target = target
        self.fixed = dict(tp=1, fused=False, causal=False, attention="sparse", **fixed)
        self.runners: dict = {}

    def schedule(self, **knobs):
        """The checked schedule of these call knobs (ScheduleError if the target cannot)."""
        from ..schedule import Schedule

        return Schedule.build(name="integration_sparse", target=self.target, **self.fixed,
                              **knobs)

    def __call__(self, inputs: SparseInputs, **knobs) -> torch.Tensor:
        from .. import runner

        key = tuple(sorted(knobs.items()))
        if key not in self.runners:
            self.runners[key] = runner(self.schedule(**knobs))
        return self.runners[key](inputs).out


DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def kernel_call(target: str):
    """The target's FlashMLA-compatible (sparse) call and its get_mla_metadata, or None."""
    if target == "torch":
        return None
    if target not in kinds():
        raise InputError(f"target {target!r} must be one of {', '.join(kinds() + ('torch',))}")
    b = backend(target)
    if SPARSE_CALL not in getattr(b, "api_names", ()):
        return None
    return b.api(SPARSE_CALL), b.api("get_mla_metadata")


class SparseLatentDecoder:
    """One card's heads of the absorbed MLA operator, token-sparse over a paged latent cache
    (c_kv | k_rope per token, k_rope rotated, in any mlagen.kvformat)."""

    def __init__(self, weights: FusedWeights, softmax_scale: float, *, target: str = "torch",
                 max_s_q: int = 1, dtype: torch.dtype = torch.bfloat16, page_size: int = 64,
                 topk: int = 0):
        self.weights, self.softmax_scale, self.dtype = weights, float(softmax_scale), dtype
        h, nope, self.rank = weights.w_uk.shape
        self.heads, self.rope_dim = h, weights.w_uq.shape[-1] - nope
        self.max_s_q = max_s_q
        self.call = kernel_call(target)
        self.topk = topk                        # the model's top-k (a schedule's topk)
        self.runner, self.runner_formats = None, ()
        if self.call is None and topk and sparse_schedules(target):
            self.runner = ScheduleRunner(target, heads=h, page_size=page_size,
                                         dtype=DTYPE_NAMES[dtype], kv_lora_rank=self.rank,
                                         rope_dim=self.rope_dim, max_s_q=max_s_q)
            self.runner_formats = tuple(getattr(backend(target), "sparse_kv_formats", ()))
        self.target = target if self.call or self.runner else "torch"   # what runs
        self.last: Optional[dict] = None        # the last step: path, indices, lse

    def __call__(self, q_lora: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                 cache_seqlens: torch.Tensor, indices: torch.Tensor,
                 kv_format: Optional[str] = None, k_descale: Optional[torch.Tensor] = None
                 ) -> torch.Tensor:
        b, s, _ = q_lora.shape
        q = reference.absorb_query(q_lora, self.weights, cache_seqlens, s, self.rope_dim,
                                   torch.float32)                       # [b, s, h, rank + rope]
        quant = k_cache.dtype not in (torch.bfloat16, torch.float16, torch.float32)
        if self.call is not None and s <= self.max_s_q:
            flash_mla_with_kvcache, get_mla_metadata = self.call
            idx, _ = compact(indices, TOPK_ALIGN)
            sched, _ = get_mla_metadata()
            o_lat, lse = flash_mla_with_kvcache(
                q.to(self.dtype).contiguous(), k_cache, block_table, cache_seqlens, self.rank,
                sched, softmax_scale=self.softmax_scale, is_fp8_kvcache=quant, indices=idx)
            path = "kernel"
        elif self.runner is not None and s <= self.max_s_q \
                and (kv_format or DTYPE_NAMES.get(k_cache.dtype)) in self.runner_formats:
            fmt = kv_format or DTYPE_NAMES[k_cache.dtype]
            pool = SparsePool(k_cache, pad_topk(indices, self.topk), kv_format=fmt)
            o_lat = self.runner(SparseInputs(q.to(self.dtype).contiguous(), [pool],
                                             self.softmax_scale, dv=self.rank),
                                kv_format=fmt, topk=self.topk)
            lse, path = None, "schedule"
        else:
            pool = SparsePool(k_cache, indices, kv_format=kv_format or None, k_descale=k_descale)
            o_lat, lse = reference.sparse_attention(q, [pool], dv=self.rank,
                                                    softmax_scale=self.softmax_scale,
                                                    rope_dim=self.rope_dim)
            path = "torch"
        self.last = dict(path=path, indices=indices, lse=lse)
        out = torch.einsum("bshc,hcv->bshv", o_lat.float(),
                           self.weights.w_uv.to(o_lat.device, torch.float32))
        return out.to(self.dtype)
