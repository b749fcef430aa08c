"""The fused MLA operator of one card's heads on a paged latent cache, on any target.

    dec = LatentDecoder(weights, softmax_scale, target=None, page_size=64, max_s_q=1)
    out = dec(q_lora, k_cache, block_table, cache_seqlens)    # [b, s_q, heads, v_head_dim]
    out = dec(q_lora, fp8_cache, block_table, cache_seqlens, k_descale=ds)   # an 8-bit cache

``target`` is a target kind whose backend has a fused operator for models (each backend's
``latent_decoder``: the emulated card runs the generated fused kernel, a GPU target the
absorption in torch around its attention kernel), or "torch": mlagen.reference.fused_absorbed
in fp32, the numerics core, which also takes any step with more query tokens than the
kernel (a prefill).  Default: the target kind whose tensors live on the model's device.

The cache holds (c_kv | k_rope) per token, k_rope already rotated, in any mlagen.kvformat
(recognised by its dtype and width; fp8_e4m3 takes k_descale fp32 [1] or [b]); the query at
row s of sequence i sits at position cache_seqlens[i] - s_q + s (bottom-right causal).
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import reference
from ..backends import all_backends, backend, default_kind, kinds
from ..errors import InputError
from ..problem import FusedWeights


def default_target(device: torch.device | str) -> str:
    """The kind whose kernels take tensors on this device (the default kind on the CPU)."""
    kind = torch.device(device).type
    if backend(default_kind()).device == kind:
        return default_kind()
    for b in all_backends():
        if b.device == kind:
            return b.kind
    return "torch"


class LatentDecoder:
    """One card's heads of the fused operator (weights already sliced to them)."""

    def __init__(self, weights: FusedWeights, softmax_scale: float, *,
                 target: Optional[str] = None, page_size: int = 64, max_s_q: int = 1,
                 heads_total: Optional[int] = None, tp: int = 1,
                 dtype: torch.dtype = torch.bfloat16, knobs: Optional[dict] = None):
        self.target = target or default_target(weights.w_uk.device)
        self.weights, self.softmax_scale, self.dtype = weights, float(softmax_scale), dtype
        h, nope, _ = weights.w_uk.shape
        self.heads, self.rope_dim = h, weights.w_uq.shape[-1] - nope
        self.impl = None
        if self.target != "torch":
            if self.target not in kinds():
                raise InputError(f"target {self.target!r} must be one of "
                                 f"{', '.join(kinds() + ('torch',))}")
            self.impl = backend(self.target).latent_decoder(
                weights, softmax_scale, page_size=page_size, max_s_q=max_s_q,
                heads_total=heads_total or h * tp, tp=tp, dtype=dtype, knobs=knobs)
            if self.impl is None:
                raise InputError(f"target {self.target!r} has no fused operator for models")

    @property
    def last(self):
        """The kernel's last outputs (None before its first step)."""
        return None if self.impl is None else self.impl.last

    def __call__(self, q_lora: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                 cache_seqlens: torch.Tensor, k_descale: Optional[torch.Tensor] = None
                 ) -> torch.Tensor:
        if self.impl is not None and q_lora.shape[1] <= self.impl.max_rows:
            if k_descale is None:
                return self.impl(q_lora, k_cache, block_table, cache_seqlens)
            return self.impl(q_lora, k_cache, block_table, cache_seqlens, k_descale=k_descale)
        # a prefill: the torch operator over the cache, dequantized exactly
        out, _ = reference.fused_absorbed(
            q_lora, self.weights, k_cache, block_table, cache_seqlens, self.softmax_scale,
            causal=True, rope_dim=self.rope_dim, dtype=torch.float32, k_descale=k_descale)
        return out.to(self.dtype)
