"""A transformers DeepseekV4 attention layer whose attention runs through mlagen's two-pool
token-sparse operator (mlagen.reference.sparse_attention; FlashMLA's indices / extra_k_cache
convention at 9241ae3).

DeepseekV4's attention (transformers >= 5.24): one shared KV head of head_dim values (512:
448 latent + 64 RoPE on the trailing dims), K = V; every head's query RMS-normed and rotated;
a sliding window of the recent tokens; on compressed layers the compressor's entries (CSA:
every compress_rate tokens pooled, its Lightning Indexer keeps index_topk per query; HCA:
pooled more heavily, attended to densely, causally); per-head sinks in the softmax; the output's
RoPE dims rotated back at the query's position, then the grouped output projection.

Here the layer's projections, RoPE, compressor, indexer and cache bookkeeping stay
transformers' own (generate()'s DynamicCache with its V4 layers); mlagen owns the attention:

    main pool   the window's keys as pages of one row each, indices = the columns the
                model's sliding-window mask lets each query see
    extra pool  the compressed entries, indices = the entries its block bias keeps
                (the CSA indexer's picks, the HCA causal ones)
    attn_sink   the layer's sinks

all in one softmax, V = the whole key (dv = head_dim: transformers rotates the output's RoPE
dims back, so they are values too).  Each pool's entries are packed valid first
(mlagen.integrations.sparse.compact), so its topk is what the step really attends to.  The
pools are paged (page_size, extra_page_size) as a kernel takes them: decode steps on a
target with a FlashMLA-compatible call (the GPU's: the window as k_cache, the compressed pool
as extra_k_cache, d_qk = head_dim) go through that call; on another target that generates
sparse kernels (the emulated card) they run its two-pool kernel (a schedule with
kv_lora_rank = head_dim - rope, v_dim = head_dim, sinks; topk = sliding_window, extra_topk
the compressed pool's count rounded up to 8); the prefill and target "torch" run
mlagen.reference.sparse_attention.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import torch
from torch import nn

from .. import reference
from ..errors import InputError, MlagenError
from ..problem import SparseInputs, SparsePool
from .sparse import (DTYPE_NAMES, ScheduleRunner, compact, kernel_call, pad_topk,
                     sparse_schedules)


def _visible(mask: Optional[torch.Tensor], shape) -> torch.Tensor:
    """A 3-D additive (0 / very negative) or boolean mask -> visible [b, s, keys]."""
    if mask is None:
        return torch.ones(shape, dtype=torch.bool)
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


def _pool(keys: torch.Tensor, visible: torch.Tensor, kind: str, page: int) -> SparsePool:
    """keys [b, n, d] as pages of `page` slots, each row's from its own page on (zero past
    n); query (i, s) names the visible.  kind: "window" or "compressed" (what it holds)."""
    b, n, d = keys.shape
    rows = -(-n // page) * page
    paged = keys.new_zeros((b, rows, d))
    paged[:, :n] = keys
    slot = (torch.arange(b, device=keys.device)[:, None, None] * rows
            + torch.arange(n, device=keys.device)[None, None, :])
    idx, _ = compact(torch.where(visible.to(keys.device), slot, -1))
    return SparsePool(paged.reshape(b * rows // page, page, 1, d), idx)


class PooledAttention(nn.Module):
    """A DeepseekV4 attention layer (kept as .inner, with its weights) whose window and
    compressed pools are attended by mlagen in one softmax with the layer's sinks."""

    def __init__(self, attn: nn.Module, config, target: str = "torch", page_size: int = 16,
                 extra_page_size: int = 8):
        super().__init__()
        self.inner, self.config, self.layer_idx = attn, config, attn.layer_idx
        self.page_size, self.extra_page_size = page_size, extra_page_size
        # decode steps through the target's FlashMLA-compatible call (the GPU target's:
        # extra_k_cache and its indices, d_qk from q), else its generated two-pool kernel, if it makes them
        self.call = kernel_call(target)
        self.runner = None
        if self.call is None and sparse_schedules(target):
            d = attn.head_dim
            self.runner = ScheduleRunner(
                target, heads=config.num_attention_heads, page_size=page_size,
                dtype=DTYPE_NAMES[attn.kv_proj.weight.dtype],
                kv_lora_rank=d - int(config.qk_rope_head_dim),
                rope_dim=int(config.qk_rope_head_dim), v_dim=d, max_s_q=1, sinks=True)
            try:        # the target takes this shape with both pools, or enable() says why
                self.runner.schedule(topk=int(config.sliding_window), extra_topk=8,
                                     extra_page_size=extra_page_size)
            except MlagenError as e:
                raise InputError(f"target {target!r} cannot run this model's two-pool "
                                 f"attention: {e}") from None
        self.target = target if self.call or self.runner is not None else "torch"
        # the model's own rotary helper (partial RoPE on the trailing dims, interleaved)
        self._rotate = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        self.rope_dim = int(config.qk_rope_head_dim)
        self.last: Optional[dict] = None        # the last step's pools and lse

    def forward(self, hidden_states: torch.Tensor, position_embeddings=None, position_ids=None,
                attention_mask=None, cache=None, past_key_values=None, **kwargs: Any):
        a, cfg = self.inner, self.config
        cache = past_key_values if cache is None else cache
        shape = hidden_states.shape[:-1]
        heads = (*shape, -1, a.head_dim)
        cos, sin = position_embeddings[a.rope_layer_type]
        q_residual = a.q_a_norm(a.q_a_proj(hidden_states))
        q = self._rotate(a.q_b_norm(a.q_b_proj(q_residual).view(*heads).transpose(1, 2)),
                         cos, sin)                                          # [b, h, s, d]
        kv = self._rotate(a.kv_norm(a.kv_proj(hidden_states)).view(*heads).transpose(1, 2),
                          cos, sin)                                         # [b, 1, s, d]
        if cache is not None:
            kv = cache.update(kv, kv, self.layer_idx, kwargs=kwargs)[0]     # [b, 1, w, d]
        compressed, bias = None, None
        if a.compressor is not None:
            compressed, bias = a.compressor(hidden_states, q_residual, position_ids, cache,
                                            self.layer_idx)                 # [b, 1, t, d]
        out = self._attend(q.transpose(1, 2), kv[:, 0], attention_mask,
                           None if compressed is None else compressed[:, 0], bias)
        out = out.to(hidden_states.dtype)                                   # [b, s, h, d]
        # K = V carried RoPE into the output: rotate it back at the query's position
        out = self._rotate(out.transpose(1, 2), cos, -sin).transpose(1, 2)
        grouped = a.o_a_proj(out.reshape(*shape, cfg.o_groups, -1)).flatten(2)
        return a.o_b_proj(grouped), None

    def _attend(self, q: torch.Tensor, window: torch.Tensor, mask, compressed, bias
                ) -> torch.Tensor:
        b, s, _, d = q.shape
        w = window.shape[1]
        if mask is not None and mask.shape[-1] != w:
            raise InputError(f"the attention mask has {mask.shape[-1]} key columns; the "
                             f"window holds {w}")
        pools = [_pool(window, _visible(None if mask is None else mask[:, 0], (b, s, w)),
                       "window", self.page_size)]
        if compressed is not None and compressed.shape[1]:
            t = compressed.shape[1]
            # as transformers: no mask -> every entry; a mask without block bias -> every
            # entry (it pads the mask with 0); else the entries the bias keeps
            keep = None if mask is None or bias is None else bias[:, 0]
            pools.append(_pool(compressed, _visible(keep, (b, s, t)), "compressed",
                               self.extra_page_size))
        sink = self.inner.sinks.detach().float()
        if self.call is not None and s == 1:
            return self._call(q, pools, sink)
        if self.runner is not None and s == 1:
            return self._kernel(q, pools, sink)
        out, lse = reference.sparse_attention(q.float(), pools, dv=d,
                                              softmax_scale=self.inner.scaling,
                                              attn_sink=sink, rope_dim=self.rope_dim)
        self.last = dict(pools=pools, lse=lse, path="torch")
        return out

    def _call(self, q: torch.Tensor, pools: list, sink: torch.Tensor) -> torch.Tensor:
        """A decode step through the target's FlashMLA-compatible call (FlashMLA 9241ae3's
        MODEL1 convention: the window as the main cache, the compressed entries as
        extra_k_cache, each with its own page size and index lists)."""
        flash_mla_with_kvcache, get_mla_metadata = self.call
        sched, _ = get_mla_metadata()
        main, extra = pools[0], (pools[1] if len(pools) > 1 else None)
        dtype = self.inner.kv_proj.weight.dtype
        out, lse = flash_mla_with_kvcache(
            q.to(dtype).contiguous(), main.k_cache.to(dtype), None, None, q.shape[-1], sched,
            softmax_scale=float(self.inner.scaling), indices=main.indices.to(torch.int32),
            attn_sink=sink.contiguous(),
            extra_k_cache=None if extra is None else extra.k_cache.to(dtype),
            extra_indices_in_kvcache=None if extra is None else extra.indices.to(torch.int32))
        self.last = dict(pools=pools, lse=lse, path="kernel")
        return out.float()

    def _kernel(self, q: torch.Tensor, pools: list, sink: torch.Tensor) -> torch.Tensor:
        """A decode step through the generated kernel: the window's topk is the sliding
        window, the compressed pool's its entries' count rounded up to 8 (a schedule each)."""
        d = q.shape[-1]
        topk = int(self.config.sliding_window)
        pools[0].indices = pad_topk(pools[0].indices, topk)
        knobs = dict(topk=topk, extra_topk=0, extra_page_size=0)
        if len(pools) > 1:
            k = -(-pools[1].indices.shape[-1] // 8) * 8
            pools[1].indices = pad_topk(pools[1].indices, k)
            knobs.update(extra_topk=k, extra_page_size=self.extra_page_size)
        inp = SparseInputs(q.to(self.inner.kv_proj.weight.dtype).contiguous(), pools,
                           float(self.inner.scaling), attn_sink=sink, dv=d)
        out = self.runner(inp, **knobs)
        self.last = dict(pools=pools, lse=None, path="schedule")
        return out.float()
