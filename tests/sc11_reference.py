"""A small float64 torch reference for the SC11 tests (mlagen.reference, once on main, is
the project's reference; this one keeps the SC11 tests independent of its arrival).

Conventions: FlashMLA's (lse natural log [b, h, s_q], causal bottom-right, no visible key ->
out 0 and lse +inf); the fused operator per mlagen.problem.FusedWeights, RoPE on interleaved
pairs at positions seqlen - s_q + i.
"""

from __future__ import annotations

import math

import torch

from mlagen.problem import MlaInputs


def attention(q: torch.Tensor, inp: MlaInputs, dv: int):
    """q [b, s_q, h, d] float64 -> out [b, s_q, h, dv], lse [b, h, s_q] (float64)."""
    b, s_q, h, d = q.shape
    page = inp.page_size
    out = torch.zeros(b, s_q, h, dv, dtype=torch.float64)
    lse = torch.full((b, h, s_q), math.inf, dtype=torch.float64)
    for i in range(b):
        L = int(inp.cache_seqlens[i])
        if L == 0:
            continue
        pages = inp.block_table[i, :-(-L // page)].long()
        k = inp.k_cache[pages].reshape(-1, d)[:L].double()
        s = torch.einsum("shd,td->sht", q[i], k) * inp.softmax_scale
        if inp.causal:
            pos = L - s_q + torch.arange(s_q)
            mask = torch.arange(L)[None, :] > pos[:, None]          # [s_q, L]
            s = s.masked_fill(mask[:, None, :], -math.inf)
        m = torch.logsumexp(s, dim=-1)                             # [s_q, h]
        p = torch.exp(s - m[..., None]).nan_to_num(0.0)
        out[i] = torch.einsum("sht,tv->shv", p, k[:, :dv])
        lse[i] = torch.where(torch.isinf(m), torch.full_like(m, math.inf), m).T
    return out, lse


def rope_interleaved(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x [b, s_q, h, r] rotated by pos [b, s_q] on pairs (x[2i], x[2i+1])."""
    r = x.shape[-1]
    freq = theta ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)      # [r/2]
    ang = pos.double()[..., None] * freq                                   # [b, s_q, r/2]
    c, s = torch.cos(ang)[:, :, None], torch.sin(ang)[:, :, None]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def absorbed_q(inp: MlaInputs, nope: int) -> torch.Tensor:
    w = inp.weights
    s_q = inp.q_lora.shape[1]
    qh = torch.einsum("bsr,rhc->bshc", inp.q_lora.double(), w.w_uq.double())
    q_lat = torch.einsum("bshn,hnk->bshk", qh[..., :nope], w.w_uk.double())
    pos = inp.cache_seqlens.long()[:, None] - s_q + torch.arange(s_q)
    q_pe = rope_interleaved(qh[..., nope:], pos, w.rope_theta)
    return torch.cat([q_lat, q_pe], dim=-1)


def run(inp: MlaInputs, problem):
    """(out, lse) of the attention-only or fused operator, float64."""
    if problem.fused:
        q = absorbed_q(inp, problem.qk_nope_head_dim)
        o, lse = attention(q, inp, problem.dv)
        return torch.einsum("bshk,hkv->bshv", o, inp.weights.w_uv.double()), lse
    return attention(inp.q.double(), inp, problem.dv)
