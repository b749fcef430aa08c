"""The fused operator for a model layer on Hopper (mlagen.integrations): the absorption and
RoPE in torch around flash_mla_with_kvcache (the generated sm_90a kernel), W_UV in torch.
The absorbed q and o_lat are rounded to the storage dtype, the points where the emulated
card stores them too."""

from __future__ import annotations

import torch

from ... import reference
from ...errors import InputError


class HopperLatent:
    def __init__(self, weights, softmax_scale: float, *, page_size: int, max_s_q: int,
                 heads_total: int, tp: int, dtype: torch.dtype, knobs=None):
        h, nope, rank = weights.w_uk.shape
        self.rope_dim = weights.w_uq.shape[-1] - nope
        if (rank, self.rope_dim) != (512, 64):
            raise InputError("the kernel has FlashMLA's shape: kv_lora_rank 512, rope 64")
        if dtype not in (torch.bfloat16, torch.float16):
            raise InputError(f"the kernel takes bf16 or fp16, not {dtype}")
        self.weights, self.softmax_scale, self.dtype = weights, float(softmax_scale), dtype
        self.heads, self.rank = h, rank
        self.max_rows = 8                  # s_q the kernel takes
        self.last = None

    def __call__(self, q_lora, k_cache, block_table, cache_seqlens, k_descale=None
                 ) -> torch.Tensor:
        from . import api

        s_q = q_lora.shape[1]
        q = reference.absorb_query(q_lora, self.weights, cache_seqlens, s_q, self.rope_dim,
                                   dtype=torch.float32).to(self.dtype)
        md, ns = api.get_mla_metadata(cache_seqlens, s_q * self.heads, 1)
        # an 8-bit cache is recognised by its dtype and width; fp8_e4m3 passes its descale
        kw = {} if k_descale is None else {"descale_k": k_descale}
        o_lat, lse = api.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens,
                                                self.rank, md, ns,
                                                softmax_scale=self.softmax_scale, causal=True,
                                                **kw)
        self.last = (o_lat, lse)
        w_uv = self.weights.w_uv.to(o_lat.device, torch.float32)
        o_lat = o_lat.to(self.dtype).float()
        return torch.einsum("bshc,hcv->bshv", o_lat, w_uv).to(self.dtype)
