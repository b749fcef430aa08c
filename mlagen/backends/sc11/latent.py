"""The SC11 fused operator for a model layer (mlagen.integrations): one card's heads, built
from a schedule made for the model's shapes; phase A rotates q with the model's rope."""

from __future__ import annotations

import functools
from typing import Optional

import torch

from ... import kvformat
from ...errors import InputError
from ...problem import TORCH_DTYPES, MlaInputs
from ...schedule.records import Schedule

_DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


@functools.lru_cache(maxsize=32)
def _runner(schedule: Schedule):
    from ...schedule.rules import plan_of
    from . import runner

    return runner(plan_of(schedule))


class Sc11Latent:
    """Knobs default to 8 cores, block_kv = the page (<= 64), double buffering and the
    batch x sequence scheme ("auto" would simulate every scheme on each step)."""

    def __init__(self, weights, softmax_scale: float, *, page_size: int, max_s_q: int,
                 heads_total: int, tp: int, dtype: torch.dtype, knobs: Optional[dict] = None):
        if dtype not in _DTYPE_NAMES:
            raise InputError(f"the emulated card takes bf16 or fp16, not {dtype}")
        h, nope, rank = weights.w_uk.shape
        k = dict(cores=8, block_kv=min(page_size, 64), buffers=2, seq_tile=512,
                 scheme="batch_seq")
        k.update(knobs or {})
        self.schedule = Schedule.build(
            name=f"model-h{h}x{tp}", target="sc11", heads=heads_total, tp=tp,
            kv_lora_rank=rank, rope_dim=weights.w_uq.shape[-1] - nope, qk_nope_head_dim=nope,
            v_head_dim=weights.w_uv.shape[-1], q_lora_rank=weights.w_uq.shape[0],
            page_size=page_size, dtype=_DTYPE_NAMES[dtype], max_s_q=max_s_q, fused=True, **k)
        if self.schedule.heads_per_device != h:
            raise InputError(f"the weights hold {h} heads but the schedule gives a card "
                             f"{self.schedule.heads_per_device}")
        self.weights, self.softmax_scale = weights, float(softmax_scale)
        self.max_rows = max_s_q
        self.last = None
        self.rank, self.rope_dim = rank, weights.w_uq.shape[-1] - nope

    def schedule_for(self, kv: str) -> Schedule:
        """The schedule of a cache in format kv (the format is compiled in)."""
        p = self.schedule.problem
        return self.schedule if kv == p.kv else self.schedule.replace(
            kv_format="" if kv == p.dtype else kv)

    def __call__(self, q_lora, k_cache, block_table, cache_seqlens, k_descale=None
                 ) -> torch.Tensor:
        kv = kvformat.detect(k_cache, self.rank, self.rope_dim)
        inp = MlaInputs(None, k_cache, block_table, cache_seqlens, self.softmax_scale, True,
                        q_lora=q_lora, weights=self.weights, kv_format=kv, k_descale=k_descale)
        self.last = _runner(self.schedule_for(kv))(inp)
        return self.last.out
