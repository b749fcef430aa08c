"""The fused MLA operator of one card's heads on a paged latent cache, on any target.

    dec = LatentDecoder(weights, softmax_scale, target="sc11", page_size=64, max_s_q=1)
    out = dec(q_lora, k_cache, block_table, cache_seqlens)    # [b, s_q, heads, v_head_dim]

Targets:
    sc11    the generated SC11 fused operator (emulated card, CPU): phase A up-projection and
            RoPE from the rotary table, phase B latent attention, phase C W_UV
    hopper  the absorption and RoPE in torch around mlagen.flash_mla_with_kvcache (the
            generated sm_90a kernel), W_UV in torch; rounding points as on SC11 (the absorbed
            q and o_lat in the storage dtype)
    torch   mlagen.reference.fused_absorbed in fp32 (the numerics core; what a step with more
            query tokens than the kernel takes, e.g. a prefill, runs on)

The cache holds (c_kv | k_rope) per token, k_rope already rotated; the query at row s of
sequence i sits at position cache_seqlens[i] - s_q + s (bottom-right causal).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from .. import reference
from ..errors import InputError
from ..problem import TORCH_DTYPES, FusedWeights, MlaInputs
from ..schedule.records import Schedule

TARGETS = ("sc11", "hopper", "torch")
_DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


def default_target(device: torch.device | str) -> str:
    return "hopper" if torch.device(device).type == "cuda" else "sc11"


@functools.lru_cache(maxsize=32)
def _sc11_runner(schedule: Schedule):
    from ..backends import sc11

    return sc11.runner(schedule)


class LatentDecoder:
    """One card's heads of the fused operator (weights already sliced to them)."""

    def __init__(self, weights: FusedWeights, softmax_scale: float, *, target: str = "sc11",
                 page_size: int = 64, max_s_q: int = 1, heads_total: Optional[int] = None,
                 tp: int = 1, dtype: torch.dtype = torch.bfloat16, sc11_knobs: Optional[dict] = None):
        if target not in TARGETS:
            raise InputError(f"target {target!r} must be one of {', '.join(TARGETS)}")
        if dtype not in _DTYPE_NAMES:
            raise InputError(f"mlagen's kernels take bf16 or fp16, not {dtype}")
        self.weights = weights
        self.softmax_scale = float(softmax_scale)
        self.target, self.page_size, self.max_s_q, self.dtype = target, page_size, max_s_q, dtype
        h, nope, rank = weights.w_uk.shape
        self.heads, self.rank = h, rank
        self.rope_dim = weights.w_uq.shape[-1] - nope
        self.schedule = None
        if target == "sc11":
            knobs = dict(cores=8, block_kv=page_size if page_size <= 64 else 64, buffers=2,
                         seq_tile=512, scheme="batch_seq")
            knobs.update(sc11_knobs or {})
            self.schedule = Schedule.build(
                name=f"hf-h{h}x{tp}", target="sc11", heads=heads_total or h * tp, tp=tp,
                kv_lora_rank=rank, rope_dim=self.rope_dim, qk_nope_head_dim=nope,
                v_head_dim=weights.w_uv.shape[-1], q_lora_rank=weights.w_uq.shape[0],
                page_size=page_size, dtype=_DTYPE_NAMES[dtype], max_s_q=max_s_q, fused=True,
                **knobs)
            if self.schedule.heads_per_device != h:
                raise InputError(f"the weights hold {h} heads but the schedule gives a card "
                                 f"{self.schedule.heads_per_device}")
        elif target == "hopper" and (rank, self.rope_dim) != (512, 64):
            raise InputError("the hopper kernel is FlashMLA's shape: kv_lora_rank 512, rope 64")
        self.last = None        # the last kernel call's MlaOutputs (trace, scheme ...)

    def __call__(self, q_lora: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                 cache_seqlens: torch.Tensor) -> torch.Tensor:
        s_q = q_lora.shape[1]
        kernel_rows = self.max_s_q if self.target == "sc11" else 8
        if self.target == "torch" or s_q > kernel_rows:
            out, _ = reference.fused_absorbed(
                q_lora, self.weights, k_cache, block_table, cache_seqlens, self.softmax_scale,
                causal=True, rope_dim=self.rope_dim, dtype=torch.float32)
            return out.to(self.dtype)
        if self.target == "sc11":
            inp = MlaInputs(None, k_cache, block_table, cache_seqlens, self.softmax_scale,
                            True, q_lora=q_lora, weights=self.weights)
            self.last = _sc11_runner(self.schedule)(inp)
            return self.last.out
        return self._hopper(q_lora, k_cache, block_table, cache_seqlens)

    def _hopper(self, q_lora, k_cache, block_table, cache_seqlens) -> torch.Tensor:
        from ..backends.hopper import api

        s_q = q_lora.shape[1]
        q = reference.absorb_query(q_lora, self.weights, cache_seqlens, s_q, self.rope_dim,
                                   dtype=torch.float32).to(self.dtype)
        md, ns = api.get_mla_metadata(cache_seqlens, s_q * self.heads, 1)
        o_lat, _ = api.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, self.rank,
                                              md, ns, softmax_scale=self.softmax_scale,
                                              causal=True)
        w_uv = self.weights.w_uv.to(o_lat.device, torch.float32)
        return torch.einsum("bshc,hcv->bshv", o_lat.float(), w_uv).to(self.dtype)
